// SPDX-License-Identifier: Apache-2.0
#pragma once

// The runtime's facade sits above compile, cache and driver (docs/architecture.md); those layers
// share CompiledKernel, KernelSource and CacheStats through kjit/kernel.hpp.
#if defined(KJIT_BELOW_RUNTIME)
#error "kjit/runtime.hpp is the runtime layer's header; layers below it include kjit/kernel.hpp"
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/kernel.hpp"
#include "kjit/plan.hpp"
#include "kjit/settings.hpp"
#include "kjit/spec.hpp"
#include "kjit/types.hpp"

namespace kjit {

/// A kernel loaded on one device. Owned by the Runtime; pointers stay valid for its lifetime.
class LoadedKernel;

/// Scratch device memory of one call, from Runtime::workspace(): allocated on a stream and freed
/// on the same stream, so it is ordered with the launches between (no host synchronization;
/// under graph capture the allocation and the free become the graph's memory nodes). Move-only.
class Workspace {
 public:
  Workspace() = default;
  /// Frees on the stream if release() was not called; errors are not reported (a destructor
  /// never throws: this is the exception path of a failed launch).
  ~Workspace();
  Workspace(Workspace&& other) noexcept;
  Workspace& operator=(Workspace&& other) noexcept;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  /// Device address; nullptr for an empty workspace.
  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Frees the memory on its stream after the work enqueued so far; DriverError on failure.
  /// An empty workspace does nothing.
  void release();

 private:
  friend class Runtime;
  void free_on_stream(bool report);

  void* data_ = nullptr;
  std::size_t size_ = 0;
  /// The context the memory was allocated in (made current around the free).
  void* context_ = nullptr;
  Stream stream_ = nullptr;
};

/// A tiled TMA tensor map to encode (Runtime::encode_tensor_map): a tensor of `rank` dimensions
/// in global memory, innermost first, and the box one copy moves.
struct TensorMapRequest {
  DType element = DType::bf16;
  int rank = 0;
  const void* base = nullptr;
  /// Elements of each dimension, innermost first.
  std::uint64_t dims[5] = {};
  /// Bytes between consecutive indices of dimensions 1 .. rank - 1 (dimension 0 is contiguous).
  std::uint64_t strides[4] = {};
  /// Elements of the box in each dimension.
  std::uint32_t box[5] = {};
  /// The shared-memory swizzle of the box's rows: 0 (none), 32, 64 or 128 bytes.
  int swizzle_bytes = 0;
};

/// Why TMA cannot take `request`, by cuTensorMapEncodeTiled's documented limits (base 16-byte
/// aligned, dims 1 .. 2^32, strides positive multiples of 16 below 2^40, boxes 1 .. 256 with rows
/// of whole 16 bytes, a swizzle of 0, 32, 64 or 128 bytes no narrower than a box row), naming the
/// field and its value; empty when it can. Runtime::encode_tensor_map refuses these before the
/// driver; the op families ask it when they decide which calls get maps. Needs no driver.
std::string tensor_map_refusal(const TensorMapRequest& request);

/// Ties plan -> cache/compile -> load -> launch together. Thread-safe. One process normally
/// uses Runtime::global(); tests make their own with explicit Settings.
class Runtime {
 public:
  explicit Runtime(Settings settings = Settings::from_env());
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The process-wide runtime, created on first use from Settings::from_env().
  static Runtime& global();

  const Settings& settings() const noexcept;

  /// The compiled kernel for a spec: from memory, a bundle, the disk cache, or NVRTC (in that
  /// order). Needs no GPU and no driver.
  std::shared_ptr<const CompiledKernel> compiled(const KernelSpec& spec,
                                                 KernelSource* source = nullptr);

  /// True when libcuda loads and at least one device exists; `why` says why not.
  bool driver_available(std::string* why = nullptr);
  int device_count();
  /// The device of the calling thread's current context, or 0 when none is current.
  int current_device();
  /// The device a call on `stream` runs on: the stream's device, or for the default stream
  /// `requested` (when >= 0) or the current context's device (0 when none is current).
  /// InvalidArgument when `requested` names another device than the stream's, or when the
  /// stream belongs to a context that is not its device's primary context.
  int device_of(Stream stream, int requested = -1);
  /// Limits of a live device, from the driver.
  DeviceLimits device_limits(int device);

  /// Compiles (if needed) and loads the kernel on `device`. Refuses (DriverError) when it would
  /// have to compile or load while `stream` is capturing, unless the settings allow it.
  const LoadedKernel& load(const KernelSpec& spec, int device, Stream stream = nullptr);
  /// Compiles and loads every spec on `device`, so later launches do no work under capture.
  void prewarm(const std::vector<KernelSpec>& specs, int device);

  /// What the driver says of a loaded function.
  FunctionLimits function_limits(const LoadedKernel& kernel) const;

  /// Checks `shape` against the device and the function, then launches the kernel with one
  /// by-value parameter block of `params_size` bytes. Throws PlanError before the driver
  /// sees an illegal launch, and InvalidArgument when `stream` belongs to another device's
  /// context (the default stream runs on the kernel's device).
  void launch(const LoadedKernel& kernel, const LaunchShape& shape, Stream stream,
              const void* params, std::size_t params_size);

  /// A plan whose kernels are loaded on one device and whose every launch passed the final
  /// check against the loaded functions' attributes. Launching it checks nothing again.
  struct ResolvedPlan {
    Plan plan;
    int device = 0;
    /// The primary context (CUcontext) of `device`: launches check that the stream belongs to
    /// it, so one device's function handles never reach another device's stream.
    void* context = nullptr;
    std::vector<const LoadedKernel*> kernels;
    /// The op's typed decisions (ops::Planned::choice) that its launch needs; null for plans
    /// memoized without one.
    std::shared_ptr<const void> choice;
  };

  /// What a memo miss makes (see memoized()): a plan, the device it is for, and the op's typed
  /// choice, kept with the resolved plan.
  struct PlannedOn {
    Plan plan;
    int device = 0;
    std::shared_ptr<const void> choice;
  };

  /// Loads every kernel of `plan` on `device` and checks each launch against the device and
  /// the function (PlanError otherwise). Capture rules of load() apply.
  ResolvedPlan resolve(Plan plan, int device, Stream stream = nullptr);

  /// Launches launch `index` of a resolved plan with one by-value parameter block: the
  /// steady-state path (no allocation, no check beyond the parameter size).
  void launch(const ResolvedPlan& resolved, std::size_t index, Stream stream, const void* params,
              std::size_t params_size);

  /// Memo of resolved plans by an op's problem signature (the bytes of a trivially copyable
  /// struct): a steady-state call is one hash lookup. `make` runs on a miss, outside any lock
  /// that other signatures need, and returns a PlannedOn (or a pair {Plan, device}).
  template <typename Signature, typename MakePlan>
  const ResolvedPlan& memoized(const Signature& signature, Stream stream, MakePlan&& make);

  /// `bytes` of scratch memory on `stream` for a call of `resolved` (its device's context),
  /// freed by the Workspace on the same stream. Outside graph capture from kjit's pool of the
  /// device, which keeps its memory between calls; under capture with cuMemAllocAsync, which
  /// capture records as a graph memory node. DriverError naming `what` on failure.
  Workspace workspace(const ResolvedPlan& resolved, std::size_t bytes, Stream stream,
                      const char* what);
  /// Whether `stream` is capturing a graph.
  bool capturing(Stream stream);
  /// Encodes `request` into `map` (128 bytes, 128-byte aligned as CUDA 13's CUtensorMap) with the
  /// driver's cuTensorMapEncodeTiled. False, with `why` saying why (and `map` zeroed), for a
  /// request outside TMA's documented limits (checked first, without the driver: base alignment,
  /// dims, strides, box sizes, the swizzle and its span) or one the driver refuses; the caller then
  /// takes a path without the map. DriverError when no driver loads; InvalidArgument for a null
  /// or misaligned `map`.
  bool encode_tensor_map(const TensorMapRequest& request, void* map, std::string* why = nullptr);
  /// Waits for `stream`, then copies `bytes` from device address `device_ptr` to `host`.
  void copy_to_host(void* host, const void* device_ptr, std::size_t bytes, Stream stream);

  CacheStats stats() const;

 private:
  const ResolvedPlan* find_memo(std::string_view signature) const;
  const ResolvedPlan& insert_memo(std::string_view signature, ResolvedPlan resolved);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

template <typename Signature, typename MakePlan>
const Runtime::ResolvedPlan& Runtime::memoized(const Signature& signature, Stream stream,
                                               MakePlan&& make) {
  static_assert(std::is_trivially_copyable_v<Signature>,
                "a plan signature is hashed as bytes: it must be trivially copyable and have "
                "no padding left uninitialized (value-initialize it)");
  const std::string_view bytes(reinterpret_cast<const char*>(&signature), sizeof(Signature));
  if (const ResolvedPlan* hit = find_memo(bytes)) return *hit;
  auto made = make();
  if constexpr (std::is_same_v<decltype(made), PlannedOn>) {
    ResolvedPlan resolved = resolve(std::move(made.plan), made.device, stream);
    resolved.choice = std::move(made.choice);
    return insert_memo(bytes, std::move(resolved));
  } else {
    auto& [plan, device] = made;
    return insert_memo(bytes, resolve(std::move(plan), device, stream));
  }
}

}  // namespace kjit
