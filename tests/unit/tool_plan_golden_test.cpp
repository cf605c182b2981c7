// SPDX-License-Identifier: Apache-2.0
// The plans of every deployment manifest, byte for byte: what `kjit plan <op> ... --json` prints
// for every problem a manifest in cache/manifests/ enumerates, on every built-in arch, compared
// with tests/golden/manifest_plans.txt. Restructuring the ops (issue 21) must not change a single
// plan; a deliberate planner change regenerates the file with KJIT_UPDATE_GOLDEN=1 and shows the
// difference in review. Built only with the tool's core (KJIT_HAVE_TOOL_CORE).
#if KJIT_HAVE_TOOL_CORE
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kjit/catalog.hpp"
#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "manifest.hpp"

namespace kjit::tool {
namespace {

namespace fs = std::filesystem;

/// One record per (manifest line, problem, arch): a header line, then the plan's JSON exactly as
/// `kjit plan --json` prints it, or the error a problem gets (refusals are behaviour too).
std::string manifest_plans() {
  std::vector<fs::path> manifests;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(fs::path(KJIT_SOURCE_DIR) / "cache" / "manifests")) {
    if (entry.path().extension() == ".txt") manifests.push_back(entry.path());
  }
  std::sort(manifests.begin(), manifests.end());
  std::string out;
  for (const fs::path& path : manifests) {
    const Manifest manifest = read_manifest(path.string());
    for (const ManifestLine& line : manifest.lines) {
      const OpInfo& op = find_op(line.op);
      for (const ShapeValues& problem : line_problems(line, op)) {
        for (const Arch arch : DeviceLimits::known_archs()) {
          out += "# " + path.filename().string() + ":" + std::to_string(line.number) + " " +
                 line.op + " " + problem_text(problem) + " @" + arch.str() + "\n";
          try {
            out += plan_from_shape(op, problem, DeviceLimits::for_arch(arch)).to_json() + "\n";
          } catch (const Error& error) {
            out += std::string("error: ") + error.what() + "\n";
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("plans of every manifest in cache/manifests are byte-identical to the golden file") {
  const fs::path golden = fs::path(KJIT_SOURCE_DIR) / "tests" / "golden" / "manifest_plans.txt";
  const std::string now = manifest_plans();
  const char* update = std::getenv("KJIT_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(golden, std::ios::binary) << now;
    MESSAGE("rewrote " << golden.string());
  }
  std::ifstream in(golden, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "missing " << golden.string()
                                        << " (KJIT_UPDATE_GOLDEN=1 writes it from this build)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string expected = buffer.str();
  CHECK(now.size() > 0);
  if (now == expected) return;
  // Name the first record that differs, not two multi-megabyte strings.
  std::istringstream a(expected), b(now);
  std::string line_a, line_b, header;
  int number = 0;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, line_a));
    const bool more_b = static_cast<bool>(std::getline(b, line_b));
    ++number;
    if (!more_a && !more_b) break;
    if (more_a && line_a.rfind("# ", 0) == 0) header = line_a;
    if (more_a != more_b || line_a != line_b) {
      FAIL("line " << number << " differs (record " << header << ")\n  golden: "
                   << (more_a ? line_a : "<end>") << "\n  now:    " << (more_b ? line_b : "<end>"));
      break;
    }
  }
}

}  // namespace kjit::tool
#endif
