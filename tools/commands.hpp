// SPDX-License-Identifier: Apache-2.0
// The subcommands of the kjit tool. Each takes its arguments (after the subcommand name) and
// returns the exit code; errors are thrown and turned into one stderr line by main().
#pragma once

#include <string>
#include <vector>

namespace kjit::tool {

using Argv = std::vector<std::string>;

int cmd_plan(const Argv& argv);
int cmd_source(const Argv& argv);
int cmd_inspect(const Argv& argv);
int cmd_precompile(const Argv& argv);
int cmd_bundle(const Argv& argv);
int cmd_cache(const Argv& argv);

/// Usage of the whole tool.
const char* main_usage();

}  // namespace kjit::tool
