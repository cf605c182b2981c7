// SPDX-License-Identifier: Apache-2.0
// The planner against a real device: every boundary shape that the planner accepts runs and
// writes what it should, every one it rejects is a PlanError before the driver sees it, and
// prewarmed kernels launch inside CUDA graph capture.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "driver/launch.hpp"
#include "kjit/error.hpp"
#include "kjit/plan.hpp"
#include "kjit/runtime.hpp"
#include "templates/probe/params.h"

namespace kjit {
namespace {

constexpr float kValue = 0.5f;

KernelSpec probe_spec(bool heavy) {
  return KernelSpec::parse(
      fmt::format("probe:heavy={}@{}", heavy ? 1 : 0, test::device_arch().base().str()));
}

ProbeParams probe_params(const test::DeviceBuffer& out, std::uint64_t count,
                         std::uint32_t smem_floats = 0) {
  return ProbeParams{static_cast<float*>(out.get()), count, kValue, smem_floats};
}

/// Every element i of `out` must be kValue + i (exact: i < 2^24 and kValue is a power of two).
void require_probe_output(const test::DeviceBuffer& out, std::uint64_t count) {
  const std::vector<float> host = out.download_as<float>(count);
  std::uint64_t wrong = 0;
  std::uint64_t first_wrong = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (host[i] != kValue + static_cast<float>(i)) {
      if (wrong++ == 0) first_wrong = i;
    }
  }
  if (wrong != 0) {
    FAIL(wrong << " of " << count << " elements wrong; first at " << first_wrong << ": "
               << host[first_wrong] << " instead of " << kValue + static_cast<float>(first_wrong));
  }
}

/// The PlanError message of a launch, or "" when it launched.
std::string launch_error(const LoadedKernel& kernel, const LaunchShape& shape,
                         const ProbeParams& params) {
  try {
    test::runtime().launch(kernel, shape, test::stream(), &params, sizeof params);
  } catch (const PlanError& error) {
    return error.what();
  }
  return {};
}

/// Rejected launches must not reach the device: the poisoned buffer stays poisoned.
void require_untouched(const test::DeviceBuffer& out, std::uint64_t count) {
  test::sync();
  const std::vector<std::uint32_t> host = out.download_as<std::uint32_t>(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    if (host[i] != 0xFFFFFFFFu) FAIL("element " << i << " was written by a rejected launch");
  }
}

LaunchShape shape(Dim3 grid, Dim3 block, std::uint32_t smem = 0) {
  return LaunchShape{grid, block, smem};
}

TEST_CASE("planner gpu: 1024 threads per block run, 1025 are rejected before the driver") {
  Runtime& rt = test::runtime();
  const LoadedKernel& kernel = rt.load(probe_spec(false), test::device(), test::stream());
  constexpr std::uint64_t kCount = 4 * 1024;
  test::DeviceBuffer out(kCount * sizeof(float));

  out.poison();
  const ProbeParams params = probe_params(out, kCount);
  CHECK(launch_error(kernel, shape({4, 1, 1}, {1024, 1, 1}), params).empty());
  test::sync();
  require_probe_output(out, kCount);

  out.poison();
  const std::string message = launch_error(kernel, shape({4, 1, 1}, {1025, 1, 1}), params);
  CAPTURE(message);
  CHECK(message.find("threads per block") != std::string::npos);
  CHECK(message.find("1025") != std::string::npos);
  require_untouched(out, kCount);
  // A 2-D block of the same size is checked by its product, not per dimension.
  CHECK(!launch_error(kernel, shape({4, 1, 1}, {32, 33, 1}), params).empty());
  require_untouched(out, kCount);
}

TEST_CASE("planner gpu: grid.y 65535 runs, 65536 is rejected") {
  Runtime& rt = test::runtime();
  const LoadedKernel& kernel = rt.load(probe_spec(false), test::device(), test::stream());
  constexpr std::uint64_t kCount = 65535;
  test::DeviceBuffer out(kCount * sizeof(float));

  out.poison();
  const ProbeParams params = probe_params(out, kCount);
  CHECK(launch_error(kernel, shape({1, 65535, 1}, {1, 1, 1}), params).empty());
  test::sync();
  require_probe_output(out, kCount);

  out.poison();
  const std::string message = launch_error(kernel, shape({1, 65536, 1}, {1, 1, 1}), params);
  CAPTURE(message);
  CHECK(message.find("grid.y is 65535 at most, the launch needs 65536") != std::string::npos);
  require_untouched(out, kCount);
}

TEST_CASE("planner gpu: 100 KiB of dynamic shared memory runs through opt-in; opt-in + 1 fails") {
  Runtime& rt = test::runtime();
  const DeviceLimits limits = rt.device_limits(test::device());
  const LoadedKernel& kernel = rt.load(probe_spec(false), test::device(), test::stream());
  const FunctionLimits function = rt.function_limits(kernel);
  constexpr std::uint32_t kSmemFloats = 25600;  // 100 KiB
  constexpr std::uint32_t kSmemBytes = kSmemFloats * sizeof(float);
  constexpr std::uint64_t kCount = 2 * 256;
  test::DeviceBuffer out(kCount * sizeof(float));

  if (limits.max_smem_per_block_optin - function.static_smem < kSmemBytes) {
    MESSAGE(limits.name << " cannot opt into 100 KiB; checking the rejection only");
    CHECK(!launch_error(kernel, shape({2, 1, 1}, {256, 1, 1}, kSmemBytes),
                        probe_params(out, kCount, kSmemFloats))
               .empty());
  } else {
    out.poison();
    CHECK(launch_error(kernel, shape({2, 1, 1}, {256, 1, 1}, kSmemBytes),
                       probe_params(out, kCount, kSmemFloats))
              .empty());
    test::sync();
    require_probe_output(out, kCount);
    // Again with the attribute already raised (the cached path).
    out.poison();
    CHECK(launch_error(kernel, shape({2, 1, 1}, {256, 1, 1}, kSmemBytes),
                       probe_params(out, kCount, kSmemFloats))
              .empty());
    test::sync();
    require_probe_output(out, kCount);
  }

  // The largest legal amount runs too.
  const auto most =
      static_cast<std::uint32_t>(limits.max_smem_per_block_optin - function.static_smem);
  out.poison();
  CHECK(
      launch_error(kernel, shape({2, 1, 1}, {256, 1, 1}, most), probe_params(out, kCount, most / 4))
          .empty());
  test::sync();
  require_probe_output(out, kCount);

  out.poison();
  const std::string message = launch_error(kernel, shape({2, 1, 1}, {256, 1, 1}, most + 1),
                                           probe_params(out, kCount, most / 4));
  CAPTURE(message);
  CHECK(message.find("dynamic shared memory") != std::string::npos);
  CHECK(message.find(std::to_string(most + 1)) != std::string::npos);
  require_untouched(out, kCount);
}

TEST_CASE("planner gpu: a register-heavy kernel at 1024 threads is rejected naming its registers") {
  Runtime& rt = test::runtime();
  const LoadedKernel& kernel = rt.load(probe_spec(true), test::device(), test::stream());
  const FunctionLimits function = rt.function_limits(kernel);
  MESSAGE("probe heavy=1: " << function.registers << " registers, max "
                            << function.max_threads_per_block << " threads per block, "
                            << function.local_bytes << " local bytes");
  REQUIRE(function.registers > 64);
  REQUIRE(function.max_threads_per_block < 1024);
  constexpr std::uint64_t kCount = 2 * 1024;
  test::DeviceBuffer out(kCount * sizeof(float));

  out.poison();
  const std::string message =
      launch_error(kernel, shape({2, 1, 1}, {1024, 1, 1}), probe_params(out, kCount));
  CAPTURE(message);
  CHECK(message.find(std::to_string(function.registers) + " registers per thread") !=
        std::string::npos);
  CHECK(message.find("threads per block") != std::string::npos);
  require_untouched(out, kCount);

  // At the function's own limit it runs.
  const auto threads = static_cast<std::uint32_t>(function.max_threads_per_block);
  const std::uint64_t count = 2ull * threads;
  out.poison();
  CHECK(launch_error(kernel, shape({2, 1, 1}, {threads, 1, 1}), probe_params(out, count)).empty());
  test::sync();
  require_probe_output(out, count);
}

/// A stream of its own for capture, destroyed at the end of the test.
class CaptureStream {
 public:
  CaptureStream() {
    test::context();
    test::check_cu(test::cu().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  ~CaptureStream() { (void)test::cu().cuStreamDestroy(stream_); }
  CaptureStream(const CaptureStream&) = delete;
  CaptureStream& operator=(const CaptureStream&) = delete;
  CUstream get() const { return stream_; }
  Stream kjit() const { return reinterpret_cast<Stream>(stream_); }

 private:
  CUstream stream_ = nullptr;
};

TEST_CASE("planner gpu: prewarmed kernels launch under graph capture; new loads are refused") {
  // A runtime of its own, so that "not loaded yet" holds whatever other tests loaded.
  Runtime rt(test::runtime().settings());
  const int device = test::device();
  const KernelSpec warm = probe_spec(false);
  rt.prewarm({warm}, device);
  const LoadedKernel& kernel = rt.load(warm, device, nullptr);
  constexpr std::uint64_t kCount = 3 * 512;
  test::DeviceBuffer out(kCount * sizeof(float));
  const ProbeParams params = probe_params(out, kCount);
  const LaunchShape launch_shape = shape({3, 1, 1}, {512, 1, 1});

  CaptureStream stream;
  out.poison();
  test::check_cu(test::cu().cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                 "cuStreamBeginCapture");
  CHECK(driver::stream_is_capturing(stream.get()));
  std::string launch_failure;
  std::string load_refusal;
  try {
    rt.launch(kernel, launch_shape, stream.kjit(), &params, sizeof params);
  } catch (const Error& error) {
    launch_failure = error.what();
  }
  try {
    (void)rt.load(probe_spec(true), device, stream.kjit());
  } catch (const Error& error) {
    load_refusal = error.what();
  }
  // End the capture whatever happened, so that the stream is usable again.
  CUgraph graph = nullptr;
  const CUresult end = test::cu().cuStreamEndCapture(stream.get(), &graph);
  CAPTURE(launch_failure);
  CAPTURE(load_refusal);
  CHECK(launch_failure.empty());
  CHECK(load_refusal.find("captur") != std::string::npos);
  test::check_cu(end, "cuStreamEndCapture");
  REQUIRE(graph != nullptr);
  CHECK_FALSE(driver::stream_is_capturing(stream.get()));

  // Capturing ran nothing: the buffer is still poisoned.
  test::check_cu(test::cu().cuStreamSynchronize(stream.get()), "cuStreamSynchronize");
  require_untouched(out, kCount);

  CUgraphExec exec = nullptr;
  test::check_cu(test::cu().cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
  for (int replay = 0; replay < 2; ++replay) {
    CAPTURE(replay);
    out.poison();
    test::check_cu(test::cu().cuGraphLaunch(exec, stream.get()), "cuGraphLaunch");
    test::check_cu(test::cu().cuStreamSynchronize(stream.get()), "cuStreamSynchronize");
    require_probe_output(out, kCount);
  }
  (void)test::cu().cuGraphExecDestroy(exec);
  (void)test::cu().cuGraphDestroy(graph);

  // Outside capture the same load is fine.
  CHECK_NOTHROW((void)rt.load(probe_spec(true), device, stream.kjit()));
}

TEST_CASE("planner gpu: the driver's limits agree with the built-in table where one exists") {
  const DeviceLimits live = test::runtime().device_limits(test::device());
  MESSAGE(live.name << " (" << live.arch.str() << "): " << live.sm_count << " SMs, "
                    << live.max_smem_per_block_optin << " bytes opt-in smem, " << live.l2_bytes
                    << " bytes L2, " << static_cast<double>(live.dram_bytes_per_second) / 1e9
                    << " GB/s DRAM");
  DeviceLimits table;
  try {
    table = DeviceLimits::for_arch(live.arch);
  } catch (const InvalidArgument&) {
    MESSAGE("no built-in limits for " << live.arch.str());
    return;
  }
  CHECK(live.max_threads_per_block == table.max_threads_per_block);
  CHECK(live.max_block_dim == table.max_block_dim);
  CHECK(live.max_grid_dim == table.max_grid_dim);
  CHECK(live.max_smem_per_block == table.max_smem_per_block);
  CHECK(live.max_smem_per_block_optin == table.max_smem_per_block_optin);
  CHECK(live.max_smem_per_sm == table.max_smem_per_sm);
  CHECK(live.reserved_smem_per_block == table.reserved_smem_per_block);
  CHECK(live.regs_per_block == table.regs_per_block);
  CHECK(live.regs_per_sm == table.regs_per_sm);
  CHECK(live.max_threads_per_sm == table.max_threads_per_sm);
  CHECK(live.max_blocks_per_sm == table.max_blocks_per_sm);
  CHECK(live.warp_size == table.warp_size);
  // The DRAM bandwidth differs between products of one arch (H100 3.35, H200 4.8 TB/s), but a
  // driver figure outside half to twice the table's product would be a misread attribute.
  CHECK(live.dram_bytes_per_second > table.dram_bytes_per_second / 2);
  CHECK(live.dram_bytes_per_second < table.dram_bytes_per_second * 2);
}

}  // namespace
}  // namespace kjit
