// SPDX-License-Identifier: Apache-2.0
// The kjit command-line tool: plan, source, inspect, precompile, bundle, cache.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "cli.hpp"
#include "commands.hpp"
#include "kjit/error.hpp"
#include "kjit/version.hpp"

namespace kjit::tool {

const char* main_usage() {
  return R"(usage: kjit <command> [arguments]   (kjit <command> --help for details)

commands:
  plan <op> [shape options] (--arch sm_XY | --device N) [--json]
                      the launch plan of an op for a problem, and why
  source <spec>       the stub source and the templates it includes, with line numbers
  inspect <spec> [--ptx] [--sass] [--resources] [--key]
                      compile (or load from the cache / a bundle) and show the result
  precompile <manifest> --arch sm_90[,sm_100a] -o out.kjb [-j N] [--verify h100,...]
                      compile a deployment's kernels into one bundle
  bundle info|verify <file.kjb>
                      show a bundle, or prove its launches legal on devices
  cache ls|stats|verify|prune|clear|explain
                      manage the disk cache
  version             the library version

A spec is family:key=value,...@arch, e.g. probe:heavy=0@sm_90.
Exit codes: 0 ok, 1 a check or a compile failed, 2 bad arguments or an unplannable problem.
)";
}

namespace {

int dispatch(int argc, char** argv) {
  if (argc < 2) throw UsageError("no command given; see kjit --help");
  const std::string_view command = argv[1];
  const Argv rest(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(main_usage(), stdout);
    return kExitOk;
  }
  if (command == "version" || command == "--version") {
    std::printf("kjit %s\n", kVersion);
    return kExitOk;
  }
  if (command == "plan") return cmd_plan(rest);
  if (command == "source") return cmd_source(rest);
  if (command == "inspect") return cmd_inspect(rest);
  if (command == "precompile") return cmd_precompile(rest);
  if (command == "bundle") return cmd_bundle(rest);
  if (command == "cache") return cmd_cache(rest);
  throw UsageError(fmt::format("unknown command '{}'; see kjit --help", command));
}

// Messages can span lines (a compile log); the first line is the error, the rest detail.
void print_error(const char* kind, const char* message) {
  std::fprintf(stderr, "kjit: %s%s\n", kind, message);
}

}  // namespace
}  // namespace kjit::tool

int main(int argc, char** argv) {
  using namespace kjit::tool;
  // Usage errors, unplannable problems and invalid arguments are the caller's to fix (2);
  // everything else (compile, cache, driver) is a failure of the run (1).
  try {
    return dispatch(argc, argv);
  } catch (const kjit::InvalidArgument& error) {
    print_error("", error.what());
    return kExitUsage;
  } catch (const kjit::PlanError& error) {
    print_error("cannot plan: ", error.what());
    return kExitUsage;
  } catch (const kjit::KernelNotInBundle& error) {
    print_error("", error.what());
    return kExitFailed;
  } catch (const kjit::CompileError& error) {
    print_error("", error.what());
    if (!error.log().empty()) std::fprintf(stderr, "%s\n", error.log().c_str());
    return kExitFailed;
  } catch (const kjit::Error& error) {
    print_error("", error.what());
    return kExitFailed;
  } catch (const std::exception& error) {
    print_error("internal error: ", error.what());
    return kExitFailed;
  }
}
