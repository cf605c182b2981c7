// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/plan.hpp"
#include "kjit/settings.hpp"
#include "kjit/spec.hpp"
#include "kjit/types.hpp"

namespace kjit {

/// The product of compiling one KernelSpec: everything needed to load it, and everything
/// needed to explain it.
struct CompiledKernel {
  KernelSpec spec;
  std::string cubin;
  std::string ptx;
  /// Mangled name of the entry point (from nvrtcGetLoweredName).
  std::string lowered_name;
  /// The exact source handed to NVRTC.
  std::string source;
  std::string options;
  /// NVRTC + ptxas log.
  std::string log;
  KernelResources resources;
  /// Cache key, 32 lowercase hex digits.
  std::string key;
  /// The tagged fields the key was computed from, one "tag: value" per line.
  std::string key_material;
};

/// Where a kernel came from the last time it was looked up.
enum class KernelSource { memory, bundle, disk, compiled };

/// Counters of the kernel cache, for tests, `kjit cache stats` and logs.
struct CacheStats {
  std::uint64_t memory_hits = 0;
  std::uint64_t bundle_hits = 0;
  std::uint64_t disk_hits = 0;
  std::uint64_t compiles = 0;
  /// Kernels loaded onto a device (once per spec and device).
  std::uint64_t loads = 0;
  /// Entries found corrupt, truncated or foreign: treated as misses and replaced.
  std::uint64_t corrupt_entries = 0;
  /// Entries that could not be written (the cache then runs memory-only).
  std::uint64_t write_failures = 0;
  bool disk_enabled = true;
  /// Whether this runtime loaded NVRTC. A fresh process whose kernels are all in a bundle, or
  /// in the disk cache with the compiler identity remembered there, never does.
  bool nvrtc_loaded = false;
};

/// A kernel loaded on one device. Owned by the Runtime; pointers stay valid for its lifetime.
class LoadedKernel;

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
  /// that other signatures need.
  template <typename Signature, typename MakePlan>
  const ResolvedPlan& memoized(const Signature& signature, Stream stream, MakePlan&& make);

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
  // make() returns {Plan, device}.
  auto [plan, device] = make();
  return insert_memo(bytes, resolve(std::move(plan), device, stream));
}

}  // namespace kjit
