// SPDX-License-Identifier: Apache-2.0
// The compile layer against the real NVRTC (dlopen()ed; no GPU needed): every template
// compiles for every target kjit ships, ptxas resources are read, and failures say where.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "codegen/embedded_templates.hpp"
#include "codegen/families.hpp"
#include "compile/compiler.hpp"
#include "kjit/error.hpp"
#include "kjit/settings.hpp"

namespace kjit::compile {
namespace {

// NVRTC as the runtime would load it (KJIT_NVRTC_LIBRARY, KJIT_CUDA_HOME/CUDA_HOME). The
// toolkit is a build dependency, so a machine that builds kjit can run these tests; a load
// failure is a test failure.
const Compiler& nvrtc() {
  const Settings settings = Settings::from_env();
  return compiler(settings.nvrtc_library, settings.resolved_cuda_home());
}

KernelSpec probe(bool heavy, std::string_view arch) {
  return KernelSpec::make("probe", {{"heavy", heavy ? "1" : "0"}}, Arch::parse(arch));
}

// How representative_specs() picks integer values.
enum class Pick {
  // The minimum (rounded up to the declared multiple): the smallest legal-looking spec.
  minimal,
  // The largest power of two up to 128 that the declaration accepts: a shape real models use;
  // the family's declared typical values take precedence (jointly constrained parameters).
  typical,
};

std::int64_t pick_integer(const codegen::ParamDecl& decl, Pick pick) {
  const std::int64_t step = std::max<std::int64_t>(decl.multiple_of, 1);
  std::int64_t minimal = decl.min;
  const std::int64_t remainder = ((minimal % step) + step) % step;
  if (remainder != 0) minimal += step - remainder;
  if (pick == Pick::typical) {
    for (std::int64_t value = 128; value >= 1; value /= 2) {
      if (value >= decl.min && value <= decl.max && value % step == 0) return value;
    }
  }
  return minimal;
}

// One spec per family for `arch` with the first accepted value of every parameter, and a
// second one with every boolean set, so both branches of `if constexpr` get compiled.
std::vector<KernelSpec> representative_specs(const codegen::FamilyDecl& family, Arch arch,
                                             Pick pick) {
  std::vector<std::pair<std::string, std::string>> first;
  std::vector<std::pair<std::string, std::string>> second;
  bool has_boolean = false;
  for (const codegen::ParamDecl& decl : family.params) {
    std::string value;
    std::string alternative;
    switch (decl.kind) {
      case codegen::ParamKind::dtype:
        value = decl.choices.empty() ? "f32" : std::string(decl.choices.front());
        break;
      case codegen::ParamKind::integer:
        value = std::to_string(pick_integer(decl, pick));
        break;
      case codegen::ParamKind::choice:
        value = decl.choices.empty() ? "" : std::string(decl.choices.front());
        break;
      case codegen::ParamKind::boolean:
        value = "0";
        alternative = "1";
        has_boolean = true;
        break;
    }
    if (const auto typical = family.typical_value(decl.name); typical && pick == Pick::typical) {
      value = std::string(*typical);
    }
    first.emplace_back(std::string(decl.name), value);
    second.emplace_back(std::string(decl.name), alternative.empty() ? value : alternative);
  }
  std::vector<KernelSpec> specs = {KernelSpec::make(family.name, first, arch)};
  if (has_boolean) specs.push_back(KernelSpec::make(family.name, second, arch));
  return specs;
}

/// Whether the compile sweeps below run a sample only: the sanitizer stages set
/// KJIT_TEST_SAMPLE_SWEEPS=1 (CMakePresets.json, scripts/test_sanitizers.sh). A sweep's time is
/// NVRTC's and ptxas's, code no sanitizer instruments, and it runs kjit's side of a compile (spec,
/// source, options, log parsing, two threads on one Compiler) the same way for every spec; the
/// main stage runs every spec. Under ASan / TSan the full sweeps took ~5 minutes of CI.
bool sample_sweeps() {
  const char* text = std::getenv("KJIT_TEST_SAMPLE_SWEEPS");
  return text != nullptr && std::string_view(text) == "1";
}

/// Under sample_sweeps(): the first two specs and the last two (two threads compile at once
/// twice; the sweeps put their special case last), said in the test's output.
void sample_specs(std::vector<KernelSpec>& specs) {
  if (!sample_sweeps() || specs.size() <= 4) return;
  const std::size_t all = specs.size();
  specs.erase(specs.begin() + 2, specs.end() - 2);
  MESSAGE("KJIT_TEST_SAMPLE_SWEEPS=1: compiling 4 of the sweep's " << all << " specs");
}

/// Every spec compiled, two at a time; errors[i] is spec i's error ("" when it compiled).
/// Under sample_sweeps() `specs` is first cut to a sample (sample_specs).
std::vector<CompiledKernel> compile_on_two_threads(const Compiler& c,
                                                   std::vector<KernelSpec>& specs,
                                                   std::vector<std::string>& errors) {
  sample_specs(specs);
  errors.assign(specs.size(), "");
  std::vector<CompiledKernel> kernels(specs.size());
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (std::size_t i = w; i < specs.size(); i += 2) {
        try {
          kernels[i] = c.compile(specs[i]);
        } catch (const Error& e) {
          errors[i] = e.what();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return kernels;
}

bool is_elf(const std::string& bytes) {
  return bytes.size() > 4 && bytes.starts_with(
                                 "\x7f"
                                 "ELF");
}

std::size_t line_count(std::string_view text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

}  // namespace

TEST_CASE("NVRTC loads and reports its identity") {
  const Compiler& c = nvrtc();
  const CompilerIdentity& id = c.identity();
  CHECK(id.major >= 12);
  const std::string prefix = fmt::format("nvrtc-{}.{}-", id.major, id.minor);
  REQUIRE(id.id.starts_with(prefix));
  const std::string hash = id.id.substr(prefix.size());
  CHECK(hash.size() == 8);
  CHECK(hash.find_first_not_of("0123456789abcdef") == std::string::npos);
  // The banner of NVVM's PTX carries the build; without it two builds of one version collide.
  CHECK(id.material.find("// Compiler Build ID") != std::string::npos);
  CHECK(id.material.find(".version") == std::string::npos);
  MESSAGE("NVRTC identity: " << id.id << " from " << c.library());

  // Computed once per Compiler, equal across Compilers of the same library.
  CHECK(&c.identity() == &id);
  const Compiler other(c.library(), c.cuda_home());
  CHECK(other.identity().id == id.id);
  CHECK(other.identity().material == id.material);
}

TEST_CASE("supported_archs lists the bases and the a/f variants") {
  const std::vector<Arch> archs = nvrtc().supported_archs();
  CHECK(std::is_sorted(archs.begin(), archs.end()));
  auto has = [&](std::string_view name) {
    return std::find(archs.begin(), archs.end(), Arch::parse(name)) != archs.end();
  };
  CHECK(has("sm_80"));
  CHECK(has("sm_90"));
  CHECK(has("sm_90a"));
  CHECK(has("sm_100"));
  CHECK(has("sm_100a"));
  CHECK(has("sm_100f"));
  CHECK_FALSE(has("sm_80a"));
  CHECK_FALSE(has("sm_90f"));
}

TEST_CASE("options_for is canonical and free of host paths") {
  const Compiler& c = nvrtc();
  const std::vector<std::string> options = c.options_for(probe(true, "sm_90a"));
  CHECK(std::is_sorted(options.begin(), options.end()));
  CHECK(std::find(options.begin(), options.end(), "--gpu-architecture=sm_90a") != options.end());
  CHECK(std::find(options.begin(), options.end(), "-std=c++20") != options.end());
  CHECK(std::find(options.begin(), options.end(), "-default-device") != options.end());
  for (const std::string& option : options) {
    CHECK(option.find(c.cuda_home()) == std::string::npos);
    CHECK(option.find("-I") != 0);
    CHECK(option.find("ptxas") == std::string::npos);
    CHECK(option.find("fast_math") == std::string::npos);
    CHECK(option.find("lineinfo") == std::string::npos);
  }
  // The parameters never reach the options: they live in the stub.
  CHECK(c.options_for(probe(false, "sm_90a")) == options);
  CHECK(c.options_for(probe(true, "sm_90")) != options);

  const std::vector<std::string> full = c.compile_options_for(probe(true, "sm_90a"));
  CHECK(std::find(full.begin(), full.end(), "-Xptxas=-v") != full.end());
  CHECK(std::find(full.begin(), full.end(), "-I" + c.cuda_home() + "/include") != full.end());
  CHECK(full.size() == options.size() + 2);
}

TEST_CASE("probe compiles to a loadable CUBIN with its ptxas report") {
  const Compiler& c = nvrtc();
  const KernelSpec spec = probe(false, "sm_90");
  const auto start = std::chrono::steady_clock::now();
  const CompiledKernel light = c.compile(spec);
  const double light_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  CHECK(light.spec == spec);
  CHECK(light.lowered_name == "_ZN4kjit12probe_kernelILb0EEEvNS_11ProbeParamsE");
  CHECK(is_elf(light.cubin));
  CHECK(light.ptx.find(".entry " + light.lowered_name) != std::string::npos);
  CHECK(light.ptx.find(".target sm_90") != std::string::npos);
  CHECK(light.ptx.back() != '\0');
  CHECK(light.source == codegen::stub_source(spec));
  CHECK(light.options.find("--gpu-architecture=sm_90") != std::string::npos);
  CHECK(light.options.find("-Xptxas=-v") != std::string::npos);
  CHECK(light.log.find("ptxas info") != std::string::npos);
  CHECK(light.key.empty());
  CHECK(light.resources.registers > 0);
  CHECK(light.resources.registers <= 32);
  CHECK(light.resources.max_threads == 0);
  CHECK(light.resources.spill_store_bytes == 0);

  const auto heavy_start = std::chrono::steady_clock::now();
  const CompiledKernel heavy = c.compile(probe(true, "sm_90"));
  const double heavy_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - heavy_start)
          .count();
  CHECK(heavy.lowered_name.starts_with("_Z"));
  // The planner's registers x threads tests rely on this kernel needing many registers.
  CHECK(heavy.resources.registers > 64);
  MESSAGE(
      fmt::format("probe@sm_90 compile: heavy=0 {:.0f} ms ({} registers), heavy=1 {:.0f} ms "
                  "({} registers)",
                  light_ms, light.resources.registers, heavy_ms, heavy.resources.registers));

  // The same spec gives the same binary, which the cache and bundles depend on.
  CHECK(c.compile(spec).cubin == light.cubin);
}

TEST_CASE("architecture-specific targets compile") {
  const Compiler& c = nvrtc();
  for (const char* arch : {"sm_90a", "sm_100a", "sm_100f"}) {
    CAPTURE(arch);
    const CompiledKernel kernel = c.compile(probe(false, arch));
    CHECK(is_elf(kernel.cubin));
    CHECK(kernel.options.find(fmt::format("--gpu-architecture={}", arch)) != std::string::npos);
    CHECK(kernel.resources.registers > 0);
  }
}

TEST_CASE("gdn_prefill_state's wide tiles compile to wgmma for sm_90a without spilling") {
  // force_mode "_wgmma" plans these (templates/common/wgmma.cuh; 3 stages handed over by
  // mbarriers, the planner's choice on sm_90a); the GPU suite runs them. The 2-stage form too.
  const Compiler& c = nvrtc();
  for (const char* spec :
       {"gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
        "ckpt=0,stages=3@sm_90a",
        "gdn_prefill_state:qkv=bf16,state=bf16,out=f16,cu=i64,index=i64,k=64,v=128,bv=128,"
        "ckpt=1,stages=3@sm_90a",
        "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
        "ckpt=0@sm_90a"}) {
    CAPTURE(spec);
    const CompiledKernel kernel = c.compile(KernelSpec::parse(spec));
    CHECK(is_elf(kernel.cubin));
    CHECK(kernel.ptx.find("wgmma.mma_async") != std::string::npos);
    CHECK(kernel.resources.spill_store_bytes == 0);
    CHECK_FALSE(wgmma_serialization(kernel.log, kernel.lowered_name).has_value());
  }
  // The portable target keeps mma.sync.
  const CompiledKernel plain = c.compile(KernelSpec::parse(
      "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
      "ckpt=0@sm_90"));
  CHECK(plain.ptx.find("wgmma") == std::string::npos);
  CHECK(plain.ptx.find("mma.sync") != std::string::npos);
}

TEST_CASE("gdn_prefill_ws compiles its TMA loads and stores for sm_90a without spilling") {
  // Both TMA paths (KJIT_TENSOR_MAPS) are compiled into every ws kernel beside the cp.async
  // copies and plain stores; the parameter block decides per call. The bench's spec, and a form
  // with checkpoints, a bf16 K-major pool, f16 out (no TMA store) and precomputed gates.
  const Compiler& c = nvrtc();
  for (const char* spec :
       {"gdn_prefill_ws:qkv=bf16,gate=bf16,param=f32,state=f32,out=bf16,cu=i32,index=i32,k=128,"
        "v=128,gated=0,l2norm=1,ckpt=0@sm_90a",
        "gdn_prefill_ws:qkv=bf16,gate=f32,param=f32,state=bf16,out=f16,cu=i64,index=i64,k=128,"
        "v=128,gated=1,l2norm=1,ckpt=1,state_layout=kv@sm_90a"}) {
    CAPTURE(spec);
    const CompiledKernel kernel = c.compile(KernelSpec::parse(spec));
    CHECK(is_elf(kernel.cubin));
    CHECK(kernel.ptx.find("cp.async.bulk.tensor.3d.shared::cluster.global") != std::string::npos);
    CHECK(kernel.ptx.find("mbarrier.arrive.expect_tx") != std::string::npos);
    const bool bf16_out = std::string(spec).find("out=bf16") != std::string::npos;
    CHECK((kernel.ptx.find("cp.async.bulk.tensor.3d.global.shared::cta") != std::string::npos) ==
          bf16_out);
    CHECK(kernel.resources.spill_store_bytes == 0);
    CHECK_FALSE(wgmma_serialization(kernel.log, kernel.lowered_name).has_value());
  }
}

TEST_CASE("gdn_prefill_state with 3 stages hands them over by mbarriers on sm_90, not on sm_80") {
  // What the planner emits for the wide tiles on sm_90 and later; sm_80 keeps the block barrier.
  const Compiler& c = nvrtc();
  for (const char* spec :
       {"gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
        "ckpt=0,stages=3@sm_90",
        "gdn_prefill_state:qkv=bf16,state=bf16,out=f16,cu=i64,index=i64,k=64,v=128,bv=64,"
        "ckpt=1,state_layout=kv,stages=3@sm_100a"}) {
    CAPTURE(spec);
    const CompiledKernel kernel = c.compile(KernelSpec::parse(spec));
    CHECK(is_elf(kernel.cubin));
    CHECK(kernel.ptx.find("cp.async.mbarrier.arrive.noinc") != std::string::npos);
    CHECK(kernel.ptx.find("mbarrier.try_wait.parity") != std::string::npos);
    CHECK(kernel.resources.spill_store_bytes == 0);
  }
  const CompiledKernel sm80 = c.compile(KernelSpec::parse(
      "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=64,v=64,bv=64,"
      "ckpt=0,stages=3@sm_80"));
  CHECK(sm80.ptx.find("mbarrier") == std::string::npos);
  CHECK(sm80.ptx.find("bar.sync") != std::string::npos);
  // Narrow tiles have no stages to choose.
  CHECK_THROWS_AS(KernelSpec::parse("gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,"
                                    "index=i32,k=128,v=128,bv=32,ckpt=0,stages=3@sm_90"),
                  InvalidArgument);
}

TEST_CASE("gdn_decode's K-major specializations compile for every shipped target") {
  // What the planner emits for K-major pools (state_layout=kv): 16-byte f32 and bf16 lines over
  // 4 and 8 warps, narrow vectors (misaligned pools), odd head dims, the gated form, rows in
  // slot order, a register cap (4 blocks of 4 warps per SM). None spills. The GPU suite runs
  // them.
  const Compiler& c = nvrtc();
  const std::string base =
      "gdn_decode:qkv={},gate={},a_log=f32,dt_bias={},state={},out={},index={},k={},v={},bv={},"
      "warps={},vec_bytes={},mode={},stages=0,min_blocks={},load_hint={},store_hint=stream,"
      "gated={},l2norm={},invalid=negative,ordered={},state_layout=kv@{}";
  struct Shape {
    const char *qkv, *state, *index;
    int k, v, bv, warps, vec_bytes;
    const char* mode;
    int min_blocks;
    const char* load_hint;
    int gated, l2norm, ordered;
  };
  const Shape shapes[] = {
      {"bf16", "f32", "i32", 128, 128, 32, 4, 16, "flat", 4, "stream", 0, 1, 0},
      {"bf16", "bf16", "i64", 128, 128, 64, 8, 16, "split", 0, "stream", 1, 1, 1},
      {"f16", "f16", "i32", 256, 256, 64, 8, 16, "folded", 0, "plain", 0, 0, 0},
      {"f32", "f32", "i32", 48, 80, 16, 1, 4, "flat", 0, "l2_256", 1, 1, 1},
      {"bf16", "bf16", "i32", 16, 16, 16, 1, 2, "folded", 0, "stream", 0, 1, 0},
  };
  std::vector<KernelSpec> specs;
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100a"}) {
    for (const Shape& s : shapes) {
      specs.push_back(KernelSpec::parse(fmt::format(
          fmt::runtime(base), s.qkv, s.qkv, s.qkv, s.state, s.qkv, s.index, s.k, s.v, s.bv, s.warps,
          s.vec_bytes, s.mode, s.min_blocks, s.load_hint, s.gated, s.l2norm, s.ordered, arch)));
    }
  }
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> kernels = compile_on_two_threads(c, specs, errors);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].str());
    REQUIRE_MESSAGE(errors[i].empty(), errors[i]);
    CHECK(is_elf(kernels[i].cubin));
    CHECK(kernels[i].resources.spill_store_bytes == 0);
    CHECK(kernels[i].resources.registers > 0);
  }
  // The V-major spec of the same call has no layout parameter, and its entry point names no
  // layout either (the template's default): the stub, and so the cache key, are unchanged.
  const KernelSpec v_major = KernelSpec::parse(
      "gdn_decode:qkv=bf16,gate=bf16,a_log=f32,dt_bias=bf16,state=f32,out=bf16,index=i32,k=128,"
      "v=128,bv=4,warps=1,vec_bytes=16,mode=flat,stages=0,min_blocks=0,load_hint=stream,"
      "store_hint=stream,gated=0,l2norm=1,invalid=negative,ordered=0,state_layout=vk@sm_90");
  CHECK(v_major.str().find("state_layout") == std::string::npos);
  CHECK(codegen::name_expression(v_major).ends_with(", true, 0, false>"));
  CHECK(codegen::name_expression(specs.front()).ends_with(", true, 0, false, 1>"));
}

TEST_CASE("gdn_decode_conv (the fused decode step) compiles for every shipped target") {
  // What the planner emits: Qwen3-Next's shape in 32-warp blocks (small grids: at most 64
  // registers a thread) and 8-warp blocks, K = 256 (two rows in flight), K = 16 (half the lanes
  // idle), the gated form, f32 weights and pools, W = 2 and 8. None spills. The GPU suite runs
  // them against the two-kernel sequence.
  const Compiler& c = nvrtc();
  const std::string base =
      "gdn_decode_conv:qkv={0},gate={1},a_log=f32,dt_bias={0},state={2},out={0},index=i32,"
      "weight={3},conv_state={3},k={4},v={5},width={6},warps={7},gated={8},l2norm=1,"
      "invalid=negative,silu={9},state_vec={11}@{10}";
  struct Shape {
    const char *qkv, *gate, *state, *weight;
    int k, v, width, warps, gated, silu, state_vec;
  };
  const Shape shapes[] = {
      {"bf16", "bf16", "f32", "bf16", 128, 128, 4, 32, 0, 1, 4},
      {"bf16", "bf16", "f32", "bf16", 128, 128, 4, 8, 0, 1, 4},
      {"f16", "f16", "bf16", "f32", 256, 64, 8, 32, 0, 1, 8},
      {"f32", "f32", "f32", "f32", 16, 256, 2, 8, 1, 0, 1},
      {"bf16", "bf16", "bf16", "bf16", 128, 128, 4, 8, 0, 1, 4},
  };
  std::vector<KernelSpec> specs;
  for (const char* arch : {"sm_80", "sm_90", "sm_100a"}) {
    for (const Shape& s : shapes) {
      specs.push_back(KernelSpec::parse(fmt::format(fmt::runtime(base), s.qkv, s.gate, s.state,
                                                    s.weight, s.k, s.v, s.width, s.warps, s.gated,
                                                    s.silu, arch, s.state_vec)));
    }
  }
  // Clustered (sm_90 and later, small batches): Qwen3-Next at B = 1 (8 blocks of 32 rows) and
  // K = V = 16 in clusters of 4 (4 rows, one warp).
  for (const char* arch : {"sm_90", "sm_100a"}) {
    specs.push_back(KernelSpec::parse(fmt::format(
        "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=bf16,state=f32,out=bf16,index=i32,"
        "weight=bf16,conv_state=bf16,k=128,v=128,width=4,warps=8,gated=0,l2norm=1,"
        "invalid=negative,silu=1,state_vec=4,cluster=8@{}",
        arch)));
    specs.push_back(KernelSpec::parse(fmt::format(
        "gdn_decode_conv:qkv=f32,gate=f32,a_log=f32,dt_bias=f32,state=f32,out=f32,index=i32,"
        "weight=f32,conv_state=f32,k=16,v=16,width=2,warps=1,gated=1,l2norm=1,"
        "invalid=nonpositive,silu=0,state_vec=1,cluster=4@{}",
        arch)));
  }
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> kernels = compile_on_two_threads(c, specs, errors);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].str());
    REQUIRE_MESSAGE(errors[i].empty(), errors[i]);
    CHECK(is_elf(kernels[i].cubin));
    CHECK(kernels[i].resources.spill_store_bytes == 0);
    CHECK(kernels[i].resources.registers > 0);
    MESSAGE(specs[i].str() << ": " << kernels[i].resources.registers << " registers");
  }
}

TEST_CASE("gdn_prefill's K-major specializations compile for every shipped target") {
  // The kernels that touch the pool, final states and checkpoints, with state_layout=kv: the
  // fused kernel, the state kernel's narrow and wide tiles, the context-parallel passes; with
  // and without checkpoints. The GPU suite runs them.
  const Compiler& c = nvrtc();
  const std::vector<std::string> texts = {
      "gdn_prefill:qkv=bf16,gate=f32,param=f32,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,"
      "bv=64,gated=1,l2norm=1,ckpt=1,state_layout=kv",
      "gdn_prefill:qkv=f16,gate=bf16,param=f32,state=bf16,out=f16,cu=i64,index=i64,k=256,v=64,"
      "bv=16,gated=0,l2norm=0,ckpt=0,state_layout=kv",
      "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=32,ckpt=1,"
      "state_layout=kv",
      "gdn_prefill_state:qkv=bf16,state=bf16,out=f32,cu=i64,index=i32,k=64,v=256,bv=128,ckpt=0,"
      "state_layout=kv,statep=1",
      "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=64,ckpt=1,"
      "state_layout=kv",
      "gdn_prefill_state_cp:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
      "ckpt=1,phase=1,stages=2,state_layout=kv",
      "gdn_prefill_state_cp:qkv=bf16,state=bf16,out=bf16,cu=i32,index=i64,k=64,v=128,bv=64,"
      "ckpt=0,phase=2,stages=3,state_layout=kv,statep=1",
  };
  std::vector<KernelSpec> specs;
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100a"}) {
    for (const std::string& text : texts) specs.push_back(KernelSpec::parse(text + "@" + arch));
  }
  // The wgmma wide tiles ("_wgmma" modes) on a K-major pool.
  specs.push_back(KernelSpec::parse(texts[4] + "@sm_90a"));
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> kernels = compile_on_two_threads(c, specs, errors);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].str());
    REQUIRE_MESSAGE(errors[i].empty(), errors[i]);
    CHECK(is_elf(kernels[i].cubin));
    CHECK(kernels[i].resources.registers > 0);
  }
  CHECK(kernels.back().ptx.find("wgmma.mma_async") != std::string::npos);
}

TEST_CASE("the sm_90a prefill kernels keep their wgmma in flight (no ptxas C7512)") {
  // ptxas serializes a kernel's wgmma when it runs short of registers for them, silently but for
  // a C7512 line in the -Xptxas=-v report: the warp-specialized kernel ran that way for weeks
  // (docs/performance.md). The chunk kernel's products and the warp-specialized kernel (192 /
  // 120 registers between its roles): every product in flight. The state kernels are checked
  // above.
  const Compiler& c = nvrtc();
  std::vector<KernelSpec> specs = {
      KernelSpec::parse("gdn_prefill_chunk:qkv=bf16,gate=bf16,param=f32,cu=i32,k=128,gated=0,"
                        "l2norm=1@sm_90a"),
      KernelSpec::parse("gdn_prefill_ws:qkv=bf16,gate=bf16,param=f32,state=f32,out=bf16,cu=i32,"
                        "index=i32,k=128,v=128,gated=0,l2norm=1,ckpt=0@sm_90a"),
      KernelSpec::parse("gdn_prefill_ws:qkv=bf16,gate=f32,param=f32,state=bf16,out=f16,cu=i64,"
                        "index=i64,k=128,v=128,gated=1,l2norm=0,ckpt=1@sm_90a"),
  };
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> kernels = compile_on_two_threads(c, specs, errors);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].str());
    REQUIRE_MESSAGE(errors[i].empty(), errors[i]);
    CHECK(kernels[i].ptx.find("wgmma.mma_async") != std::string::npos);
    // The report is there to be read (an empty log would pass the check below vacuously).
    CHECK(kernels[i].log.find("ptxas info") != std::string::npos);
    const auto why = wgmma_serialization(kernels[i].log, kernels[i].lowered_name);
    CHECK_MESSAGE(!why.has_value(), "ptxas serialized the wgmma: " << why.value_or(""));
  }
}

TEST_CASE("every family's template compiles for sm_80, sm_90 and sm_100a") {
  const Compiler& c = nvrtc();
  // Each job: the minimal spec, and the typical one to fall back on when the template's own
  // static_asserts reject the minimal one (a constraint between parameters the declaration
  // cannot express, e.g. gdn_decode's "a tile is whole rows-per-warp for every warp").
  struct Job {
    KernelSpec minimal;
    KernelSpec typical;
    CompiledKernel kernel;
    std::string error;
    std::string note;
  };
  std::vector<Job> jobs;
  for (const codegen::FamilyDecl& family : codegen::families()) {
    if (family.params.empty() && codegen::find_template(family.include) == nullptr) {
      MESSAGE("skipping family " << family.name << ": " << family.include << " does not exist yet");
      continue;
    }
    for (const char* arch_text : {"sm_80", "sm_90", "sm_100a"}) {
      // The sample: one target (sample_sweeps()).
      if (sample_sweeps() && std::string_view(arch_text) != "sm_90") continue;
      const Arch arch = Arch::parse(arch_text);
      if (arch.sm() < family.min_sm) {
        MESSAGE("skipping " << family.name << " at " << std::string_view(arch_text)
                            << ": it needs sm_" << family.min_sm);
        continue;
      }
      const std::vector<KernelSpec> typical = representative_specs(family, arch, Pick::typical);
      std::vector<KernelSpec> minimal;
      try {
        minimal = representative_specs(family, arch, Pick::minimal);
      } catch (const InvalidArgument& e) {
        // The family's joint check refuses the smallest picks (the template would too): the
        // typical spec stands in, and the refusal must name why.
        MESSAGE("the declaration's check refuses the minimal "
                << family.name << " spec: " << std::string(e.what()));
        minimal = typical;
      }
      for (std::size_t i = 0; i < minimal.size(); ++i) {
        jobs.push_back(Job{.minimal = minimal[i], .typical = typical[i]});
      }
    }
  }
  REQUIRE(!jobs.empty());

  // Compiled on several threads at once: this is also the test that one Compiler is safe to
  // share. Results are checked on this thread.
  const unsigned workers = std::clamp(std::thread::hardware_concurrency(), 2u, 8u);
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (std::size_t i = w; i < jobs.size(); i += workers) {
        Job& job = jobs[i];
        try {
          job.kernel = c.compile(job.minimal);
          continue;
        } catch (const CompileError& e) {
          const bool only_constraints =
              e.log().find("static assertion failed") != std::string::npos;
          if (!only_constraints || job.typical == job.minimal) {
            job.error = std::string(e.what()) + "\n" + e.log();
            continue;
          }
          job.note = error_lines(e.log(), 1).front();
        }
        try {
          job.kernel = c.compile(job.typical);
        } catch (const CompileError& e) {
          job.error = std::string(e.what()) + "\n" + e.log();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  for (const Job& job : jobs) {
    CAPTURE(job.minimal.str());
    CHECK_MESSAGE(job.error.empty(), job.error);
    if (!job.error.empty()) continue;
    if (!job.note.empty()) {
      MESSAGE("the declaration accepts " << job.minimal.str() << " but the template rejects it ("
                                         << job.note << "); compiled " << job.typical.str()
                                         << " instead");
    }
    const CompiledKernel& kernel = job.kernel;
    CHECK((kernel.spec == job.minimal || kernel.spec == job.typical));
    CHECK(kernel.lowered_name.starts_with("_Z"));
    CHECK(is_elf(kernel.cubin));
    CHECK(kernel.ptx.find(".entry") != std::string::npos);
    CHECK(kernel.resources.registers > 0);
  }
}

TEST_CASE("every embedded template compiles standalone") {
  // Includes each file on its own, so a header that forgets an #include it needs fails here
  // even when every family happens to include things in a working order.
  const Compiler& c = nvrtc();
  const std::vector<HeaderFile> headers = embedded_headers();
  const KernelSpec target = probe(false, "sm_90");
  for (const codegen::EmbeddedTemplate& file : codegen::embedded_templates()) {
    CAPTURE(file.include_name);
    SourceProgram program;
    program.name = "kjit_standalone.cu";
    program.source = fmt::format("#include \"{}\"\n", file.include_name);
    program.headers = headers;
    program.options = c.compile_options_for(target);
    program.what = file.include_name;
    CHECK_NOTHROW(c.compile_source(program));
  }
}

TEST_CASE("compile_source reports shared memory and launch bounds") {
  const Compiler& c = nvrtc();
  SourceProgram program;
  program.name = "kjit_bounds.cu";
  program.source =
      "__global__ void __launch_bounds__(128) bounded(float* out) {\n"
      "  __shared__ float tile[64];\n"
      "  tile[threadIdx.x % 64] = float(threadIdx.x);\n"
      "  __syncthreads();\n"
      "  out[threadIdx.x] = tile[(threadIdx.x + 1) % 64];\n"
      "}\n";
  program.name_expression = "&bounded";
  program.options = c.compile_options_for(probe(false, "sm_90"));
  program.what = "bounded test kernel";
  const CompileOutput output = c.compile_source(program);
  REQUIRE(output.lowered_name == "_Z7boundedPf");
  CHECK(ptx_max_threads(output.ptx, output.lowered_name) == 128);
  const auto report = parse_ptxas_report(output.log);
  REQUIRE(report.count(output.lowered_name) == 1);
  CHECK(report.at(output.lowered_name).static_smem == 64 * 4);
  // The cubin fallback (no ptxas report in the log) reads the same figures from the ELF.
  const auto from_cubin = cubin_resources(output.cubin, output.lowered_name);
  REQUIRE(from_cubin.has_value());
  CHECK(from_cubin->registers == report.at(output.lowered_name).registers);
  CHECK_FALSE(cubin_resources(output.cubin, "_Z5otherPf").has_value());
}

TEST_CASE("NVRTC runs on a stack of its own, not the caller's") {
  // NVRTC's front end recurses with the source's nesting and crashes the process (SIGSEGV) when
  // the stack runs out: a 4000-deep expression needs more than 8 MiB (NVRTC 13.0). Compiled from
  // a thread with 1 MiB of stack, as threads of other runtimes have, this test died with the
  // process before compile_source moved NVRTC onto a thread of its own.
  const Compiler& c = nvrtc();
  std::string expression = "x";
  for (int depth = 0; depth < 4000; ++depth) expression = "(" + expression + " + 1)";
  SourceProgram program;
  program.name = "kjit_nested.cu";
  program.source =
      "__global__ void nested(int* out) { const int x = *out; *out = " + expression + "; }\n";
  program.name_expression = "&nested";
  program.options = c.compile_options_for(probe(false, "sm_90"));
  program.what = "deeply nested test kernel";
  struct Call {
    const Compiler* compiler;
    const SourceProgram* program;
    std::string lowered_name;
    std::string error;
  } call{&c, &program, {}, {}};
  const auto run = [](void* argument) -> void* {
    auto* job = static_cast<Call*>(argument);
    try {
      job->lowered_name = job->compiler->compile_source(*job->program).lowered_name;
    } catch (const std::exception& e) {
      job->error = e.what();
    }
    return nullptr;
  };
  pthread_attr_t attributes;
  REQUIRE(pthread_attr_init(&attributes) == 0);
  REQUIRE(pthread_attr_setstacksize(&attributes, std::size_t{1} << 20) == 0);
  pthread_t thread;
  REQUIRE(pthread_create(&thread, &attributes, run, &call) == 0);
  pthread_attr_destroy(&attributes);
  REQUIRE(pthread_join(thread, nullptr) == 0);
  CHECK(call.error.empty());
  CHECK(call.lowered_name == "_Z6nestedPi");
}

TEST_CASE("cubin_resources agrees with the ptxas report on real kernels") {
  // Light and heavy probes (few and many registers) and a family kernel near the 255 limit.
  const Compiler& c = nvrtc();
  const std::vector<KernelSpec> specs = {
      probe(false, "sm_90"), probe(true, "sm_90"), probe(true, "sm_100a"),
      KernelSpec::parse("gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,"
                        "v=128,bv=128,ckpt=0@sm_90")};
  for (const KernelSpec& spec : specs) {
    CAPTURE(spec.str());
    const CompiledKernel kernel = c.compile(spec);
    REQUIRE(kernel.resources.registers > 0);  // from the log's report
    const auto from_cubin = cubin_resources(kernel.cubin, kernel.lowered_name);
    REQUIRE(from_cubin.has_value());
    CHECK(from_cubin->registers == kernel.resources.registers);
    CHECK(from_cubin->local_bytes == kernel.resources.local_bytes);
  }
}

TEST_CASE("spills are read from a real ptxas report") {
  const Compiler& c = nvrtc();
  const KernelSpec spec = probe(true, "sm_90");
  SourceProgram program;
  program.name = program_name(spec);
  program.source = codegen::stub_source(spec);
  program.name_expression = codegen::name_expression(spec);
  program.headers = embedded_headers();
  program.options = c.compile_options_for(spec);
  // Forces the heavy probe to spill.
  program.options.push_back("--maxrregcount=32");
  program.what = spec.str();
  const CompileOutput output = c.compile_source(program);
  const KernelResources resources = parse_ptxas_report(output.log).at(output.lowered_name);
  CHECK(resources.registers <= 32);
  CHECK(resources.spill_store_bytes > 0);
  CHECK(resources.spill_load_bytes > 0);
  CHECK(resources.local_bytes > 0);
  // The cubin fallback reads the same stack frame (a nonzero one: the records are matched to
  // this kernel, not read as zero).
  const auto from_cubin = cubin_resources(output.cubin, output.lowered_name);
  REQUIRE(from_cubin.has_value());
  CHECK(from_cubin->registers == resources.registers);
  CHECK(from_cubin->local_bytes == resources.local_bytes);
}

TEST_CASE("a broken template fails with its file:line in the log") {
  const Compiler& c = nvrtc();
  const KernelSpec spec = probe(true, "sm_90");
  std::vector<HeaderFile> headers = embedded_headers();
  const auto probe_header = std::find_if(headers.begin(), headers.end(), [](const HeaderFile& h) {
    return h.name == "templates/probe/probe.cuh";
  });
  REQUIRE(probe_header != headers.end());
  if (!probe_header->contents.ends_with('\n')) probe_header->contents += '\n';
  const std::size_t broken_line = line_count(probe_header->contents) + 1;
  probe_header->contents += "namespace kjit { __device__ int broken = kjit_undefined_name; }\n";

  SourceProgram program;
  program.name = program_name(spec);
  program.source = codegen::stub_source(spec);
  program.name_expression = codegen::name_expression(spec);
  program.headers = headers;
  program.options = c.compile_options_for(spec);
  program.what = spec.str();
  CHECK(program.name == "kjit_stub_probe.cu");
  try {
    c.compile_source(program);
    FAIL("a broken template compiled");
  } catch (const CompileError& e) {
    const std::string location = fmt::format("templates/probe/probe.cuh:{}:", broken_line);
    const std::string what = e.what();
    CHECK(what.find(spec.str()) != std::string::npos);
    CHECK(what.find(location) != std::string::npos);
    CHECK(what.find("kjit_undefined_name") != std::string::npos);
    CHECK(what.find("--gpu-architecture=sm_90") != std::string::npos);
    CHECK(e.log().find(location + " error") != std::string::npos);
    CHECK(e.log().find("templates/probe/probe.cuh(") == std::string::npos);
    CHECK(e.spec() == spec.str());
    CHECK(e.options().find("-std=c++20") != std::string::npos);
  }
}

TEST_CASE("an error in the stub names the stub") {
  const Compiler& c = nvrtc();
  SourceProgram program;
  program.name = "kjit_stub_probe.cu";
  program.source =
      "// line 1\n#include \"templates/probe/probe.cuh\"\nstatic_assert(false, \"kjit test\");\n";
  program.headers = embedded_headers();
  program.options = c.compile_options_for(probe(false, "sm_90"));
  program.what = "stub test";
  try {
    c.compile_source(program);
    FAIL("a broken stub compiled");
  } catch (const CompileError& e) {
    CHECK(e.log().find("kjit_stub_probe.cu:3: error") != std::string::npos);
    CHECK(std::string(e.what()).find("stub test") != std::string::npos);
  }
}

TEST_CASE("an unsupported target is refused before compiling") {
  const Compiler& c = nvrtc();
  for (const char* arch : {"sm_89a", "sm_70"}) {
    CAPTURE(arch);
    try {
      c.compile(probe(false, arch));
      FAIL("compiled for an unsupported target");
    } catch (const CompileError& e) {
      const std::string what = e.what();
      CHECK(what.find(std::string("cannot target ") + arch) != std::string::npos);
      CHECK(what.find("sm_90a") != std::string::npos);
      CHECK(e.spec() == probe(false, arch).str());
    }
  }
}

TEST_CASE("missing libnvrtc says how to point kjit at one") {
  const std::string path = "/nonexistent/libnvrtc.so";
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      // Through the accessor twice: a failed load must not be cached as a success.
      (void)compiler(path, "/nonexistent/cuda");
      FAIL("loaded a library that does not exist");
    } catch (const CompileError& e) {
      const std::string what = e.what();
      CHECK(what.find(path) != std::string::npos);
      CHECK(what.find("KJIT_NVRTC_LIBRARY") != std::string::npos);
      // dlerror's text is kept.
      CHECK(what.find("No such file") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(Compiler("/nonexistent/libnvrtc.so", ""), CompileError);
  // A library that exists but is not NVRTC.
  try {
    Compiler not_nvrtc("libc.so.6", "");
    FAIL("libc accepted as NVRTC");
  } catch (const CompileError& e) {
    CHECK(std::string(e.what()).find("nvrtc") != std::string::npos);
  }
}

TEST_CASE("a Compiler can be moved") {
  Compiler first(nvrtc().library(), nvrtc().cuda_home());
  Compiler second = std::move(first);
  CHECK(second.compile(probe(false, "sm_80")).lowered_name.starts_with("_Z"));
  first = std::move(second);
  CHECK(!first.identity().id.empty());
}

}  // namespace kjit::compile
