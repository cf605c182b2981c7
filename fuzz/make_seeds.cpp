// SPDX-License-Identifier: Apache-2.0
// Writes valid binary seeds for the entry and bundle fuzz targets: a fuzzer that starts from
// well-formed files gets past the magic, version and checksum checks and exercises the field
// parsing behind them. Bundles carry this build's library version and template digest, so the
// ctest run regenerates them (fuzz/CMakeLists.txt); the committed copies seed long runs.
//   kjit_fuzz_make_seeds <corpus dir>   -> <dir>/entry/*.kjc, <dir>/bundle/*.kjb
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/bundle.hpp"
#include "cache/entry.hpp"
#include "kjit/spec.hpp"
#include "support/hash.hpp"

namespace {

kjit::CompiledKernel kernel(const std::string& spec_text, int registers, std::size_t cubin) {
  kjit::CompiledKernel k;
  k.spec = kjit::KernelSpec::parse(spec_text);
  k.cubin = std::string(cubin, '\x7f');
  k.ptx = "// ptx\n.version 8.0\n";
  k.lowered_name = "_Z5probev";
  k.source = "#include \"kjit/probe.cuh\"\n";
  k.options = "-arch=sm_90\n";
  k.log = "ptxas info    : Used 16 registers\n";
  k.resources.registers = registers;
  k.resources.static_smem = 1024;
  k.resources.max_threads = 256;
  k.key = kjit::support::xxh3_128(spec_text).hex();
  k.key_material = "spec: " + spec_text + "\n";
  return k;
}

void write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  std::filesystem::create_directories(dir / "entry");
  std::filesystem::create_directories(dir / "bundle");
  const std::vector<kjit::CompiledKernel> kernels = {kernel("probe:heavy=0@sm_90", 16, 64),
                                                     kernel("probe:heavy=1@sm_90", 255, 8),
                                                     kernel("probe:heavy=0@sm_100a", 18, 0)};
  int i = 0;
  for (const kjit::CompiledKernel& k : kernels) {
    kjit::support::Hash128 key;
    kjit::support::Hash128::parse_hex(k.key, &key);
    write(dir / "entry" / ("seed" + std::to_string(i++) + ".kjc"),
          kjit::cache::encode_entry(key, k));
  }
  const auto info = kjit::cache::BundleInfo::current("nvrtc-seed", {"sm_90", "sm_100a"}, "probe\n");
  write(dir / "bundle" / "three.kjb", kjit::cache::encode_bundle(info, kernels));
  write(dir / "bundle" / "one.kjb", kjit::cache::encode_bundle(info, {kernels[1]}));
  write(dir / "bundle" / "empty.kjb", kjit::cache::encode_bundle(info, {}));
  std::printf("wrote %zu entry and 3 bundle seeds under %s\n", kernels.size(), argv[1]);
  return 0;
}
