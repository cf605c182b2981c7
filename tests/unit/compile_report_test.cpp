// SPDX-License-Identifier: Apache-2.0
// The text parsers of the compile layer on synthetic input: ptxas reports in the formats of
// several CUDA versions, PTX launch bounds, and NVRTC log locations.
#include <doctest/doctest.h>

#include <string>

#include "compile/compiler.hpp"

namespace kjit::compile {

TEST_CASE("parse_ptxas_report reads the NVRTC 13 format") {
  // As printed by NVRTC 13.0 for templates/probe/probe.cuh with -Xptxas=-v (plus a second kernel
  // with shared memory, constant memory and spills).
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function '_ZN4kjit12probe_kernelILb1EEEvNS_11ProbeParamsE'"
      " for 'sm_90'\n"
      "ptxas info    : Function properties for _ZN4kjit12probe_kernelILb1EEEvNS_11ProbeParamsE\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 169 registers, used 1 barriers\n"
      "ptxas info    : Compile time = 260.712 ms\n"
      "ptxas info    : Compiling entry function '_Z2k2v' for 'sm_90'\n"
      "ptxas info    : Function properties for _Z2k2v\n"
      "ptxas         .     1200 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
      "ptxas info    : Used 14 registers, used 0 barriers, 1200 bytes cumulative stack size, "
      "400 bytes smem, 384 bytes cmem[0]\n";
  const auto report = parse_ptxas_report(log);
  REQUIRE(report.size() == 2);
  const KernelResources& probe = report.at("_ZN4kjit12probe_kernelILb1EEEvNS_11ProbeParamsE");
  CHECK(probe.registers == 169);
  CHECK(probe.static_smem == 0);
  CHECK(probe.local_bytes == 0);
  CHECK(probe.const_bytes == 0);
  const KernelResources& k2 = report.at("_Z2k2v");
  CHECK(k2.registers == 14);
  CHECK(k2.static_smem == 400);
  CHECK(k2.local_bytes == 1200);
  CHECK(k2.spill_store_bytes == 24);
  CHECK(k2.spill_load_bytes == 16);
  CHECK(k2.const_bytes == 384);
  CHECK(k2.max_threads == 0);
}

TEST_CASE("wgmma_serialization finds ptxas's C7512 line of the kernel asked about") {
  // As nvcc 13.0 / NVRTC 13.0 printed it for the warp-specialized prefill kernel at 184 state
  // registers (docs/performance.md); a second kernel without it.
  const std::string ws = "_ZN4kjit21gdn_prefill_ws_kernelI13__nv_bfloat16EEvNS_16GdnPrefillParamsE";
  const std::string log =
      "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to insufficient register resources for the function '" +
      ws +
      "'\n"
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function '" +
      ws +
      "' for 'sm_90a'\n"
      "ptxas info    : Used 168 registers, used 16 barriers, 184 bytes cumulative stack size\n"
      "ptxas info    : Compiling entry function '_Z2k2v' for 'sm_90a'\n"
      "ptxas info    : Used 14 registers, used 0 barriers\n";
  const auto why = wgmma_serialization(log, ws);
  REQUIRE(why.has_value());
  CHECK(*why == "insufficient register resources");
  CHECK_FALSE(wgmma_serialization(log, "_Z2k2v").has_value());
  // A prefix of the name is another kernel.
  CHECK_FALSE(wgmma_serialization(log, ws.substr(0, ws.size() - 1)).has_value());
  CHECK_FALSE(wgmma_serialization("", ws).has_value());
  // The reports still parse around the line.
  CHECK(parse_ptxas_report(log).at(ws).registers == 168);
}

TEST_CASE("parse_ptxas_report reads older formats and keeps callees apart") {
  // nvcc-style indentation, a non-inlined callee whose frame precedes the entry's, and the
  // CUDA 11 "Used" line without barriers but with lmem.
  const std::string log =
      "ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_80'\n"
      "ptxas info    : Function properties for _Z6helperv\n"
      "    64 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
      "ptxas info    : Function properties for _Z6kernelPf\n"
      "    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 32 registers, 48 bytes lmem, 1024 bytes smem, 360 bytes cmem[0], "
      "4 bytes cmem[2]\n";
  const auto report = parse_ptxas_report(log);
  REQUIRE(report.size() == 1);
  const KernelResources& kernel = report.at("_Z6kernelPf");
  CHECK(kernel.registers == 32);
  CHECK(kernel.static_smem == 1024);
  CHECK(kernel.const_bytes == 360);
  // lmem and stack frame both describe local memory; the larger one is what a thread needs.
  CHECK(kernel.local_bytes == 48);
  CHECK(kernel.spill_store_bytes == 0);
  CHECK(report.count("_Z6helperv") == 0);
}

TEST_CASE("parse_ptxas_report ignores logs without a report") {
  CHECK(parse_ptxas_report("").empty());
  CHECK(parse_ptxas_report("kjit_stub_probe.cu(2): warning #177-D: label unused\n").empty());
}

TEST_CASE("ptx_max_threads reads .maxntid of the named entry only") {
  const std::string ptx =
      ".visible .entry _Z1kPf(\n\t.param .u64 _Z1kPf_param_0\n)\n{\n\tret;\n}\n"
      ".visible .entry _Z1kPfi(\n\t.param .u64 _Z1kPfi_param_0\n)\n.maxntid 256, 1, 1\n"
      "{\n\tret;\n}\n"
      ".visible .entry _Z2k3v()\n.maxntid 16, 8, 2\n.minnctapersm 2\n{\n\tret;\n}\n";
  CHECK(ptx_max_threads(ptx, "_Z1kPf") == 0);
  CHECK(ptx_max_threads(ptx, "_Z1kPfi") == 256);
  CHECK(ptx_max_threads(ptx, "_Z2k3v") == 256);
  CHECK(ptx_max_threads(ptx, "_Z7missingv") == 0);
  CHECK(ptx_max_threads(ptx, "") == 0);
}

TEST_CASE("map_log_locations rewrites NVRTC locations as template file:line") {
  const std::string log =
      "templates/merge_state/merge_state.cuh(12): error: identifier \"y\" is undefined\n"
      "    int x = y;\n"
      "            ^\n"
      "          detected during instantiation of \"void kjit::f<T>() [with T=float]\" at line "
      "3 of templates/common/math.cuh\n"
      "kjit_stub_merge_state.cu(4): warning #177-D: label \"l\" was declared but never "
      "referenced\n"
      "2 errors detected in the compilation of \"kjit_stub_merge_state.cu\".\n";
  const std::string mapped = map_log_locations(log);
  CHECK(mapped.find(
            "templates/merge_state/merge_state.cuh:12: error: identifier \"y\" is undefined\n") ==
        0);
  CHECK(mapped.find("at templates/common/math.cuh:3\n") != std::string::npos);
  CHECK(mapped.find("kjit_stub_merge_state.cu:4: warning #177-D") != std::string::npos);
  // Source excerpts and summaries are left alone.
  CHECK(mapped.find("\n    int x = y;\n") != std::string::npos);
  CHECK(mapped.find("compilation of \"kjit_stub_merge_state.cu\".\n") != std::string::npos);
  CHECK(mapped.find("(12)") == std::string::npos);
  // Text that only looks like a location stays.
  CHECK(map_log_locations("f(x): not a location") == "f(x): not a location");
  CHECK(map_log_locations("a b(3): spaces in name") == "a b(3): spaces in name");
  CHECK(map_log_locations("no newline at end") == "no newline at end");
}

TEST_CASE("error_lines picks the diagnostics") {
  const std::string log =
      "templates/probe/probe.cuh:46: warning: something\n"
      "templates/probe/probe.cuh:47: error: identifier \"y\" is undefined\n"
      "    int x = y;\n"
      "Command-line error: invalid or no value specified with --nv_arch flag\n";
  const auto lines = error_lines(log);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "templates/probe/probe.cuh:47: error: identifier \"y\" is undefined");
  CHECK(lines[1].starts_with("Command-line error"));
  CHECK(error_lines(log, 1).size() == 1);
  // Without a marked error the first lines stand in, so a message never comes out empty.
  const auto fallback = error_lines("\nsomething odd happened\nand more\n", 1);
  REQUIRE(fallback.size() == 1);
  CHECK(fallback[0] == "something odd happened");
}

TEST_CASE("cubin_resources refuses what is not a well-formed 64-bit ELF") {
  CHECK_FALSE(cubin_resources("", "k").has_value());
  CHECK_FALSE(cubin_resources("not an elf at all, but long enough to be read as one......."
                              "................",
                              "k")
                  .has_value());
  // An ELF64 header whose section table lies past the end of the data.
  std::string truncated(64, '\0');
  truncated.replace(0, 6,
                    "\x7f"
                    "ELF\x02\x01");
  truncated[40] = '\x7f';  // e_shoff far beyond 64 bytes
  truncated[58] = 64;      // e_shentsize
  truncated[60] = 3;       // e_shnum
  truncated[62] = 1;       // e_shstrndx
  CHECK_FALSE(cubin_resources(truncated, "k").has_value());
}

}  // namespace kjit::compile
