// SPDX-License-Identifier: Apache-2.0
// The facade: spec -> (memory | disk cache | NVRTC) -> loaded function per device -> checked
// launch. Everything here is thread-safe; the steady-state launch path takes no lock beyond a
// shared one for the plan memo.
#include "kjit/runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "cache/bundle.hpp"
#include "cache/disk_cache.hpp"
#include "cache/key.hpp"
#include "codegen/embedded_templates.hpp"
#include "codegen/families.hpp"
#include "compile/compiler.hpp"
#include "driver/driver_api.hpp"
#include "driver/launch.hpp"
#include "kjit/error.hpp"
#include "runtime/loaded_kernel.hpp"
#include "support/log.hpp"

namespace kjit {

namespace {

using Clock = std::chrono::steady_clock;

// Lets the plan memo be searched with a string_view of signature bytes, allocation-free.
struct SignatureHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view bytes) const noexcept {
    return std::hash<std::string_view>{}(bytes);
  }
};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

struct Runtime::Impl {
  explicit Impl(Settings s)
      : settings((support::set_log_level(s.log_level), std::move(s))),
        bundles(settings.bundle_paths) {}

  Settings settings;
  // Searched before the disk cache; a bad bundle fails construction loudly (CacheError) rather
  // than silently falling back to JIT in production.
  cache::BundleSet bundles;

  // NVRTC and the disk cache are created on first need: planning, bundle loads and launches of
  // already-loaded kernels work without libnvrtc.
  std::mutex compiler_mutex;
  std::unique_ptr<compile::Compiler> compiler;
  std::unique_ptr<cache::DiskCache> disk;

  // Compiled kernels by spec text, with single flight: concurrent requests for one spec wait
  // for the first.
  std::mutex compiled_mutex;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const CompiledKernel>>>
      compiled;

  // Loaded kernels by (spec text, device). Pointers stay valid for the runtime's lifetime.
  std::mutex loaded_mutex;
  std::map<std::pair<std::string, int>, std::unique_ptr<LoadedKernel>> loaded;

  std::mutex limits_mutex;
  std::map<int, DeviceLimits> device_limits;
  std::map<int, std::unique_ptr<driver::PrimaryContext>> contexts;

  mutable std::shared_mutex memo_mutex;
  std::unordered_map<std::string, std::unique_ptr<ResolvedPlan>, SignatureHash, std::equal_to<>>
      memo;

  std::atomic<std::uint64_t> memory_hits{0};
  std::atomic<std::uint64_t> bundle_hits{0};
  std::atomic<std::uint64_t> disk_hits{0};
  std::atomic<std::uint64_t> compiles{0};

  // Set once a sticky device fault was seen: every later call reports it.
  std::atomic<bool> faulted{false};
  std::mutex fault_mutex;
  std::string fault_message;

  compile::Compiler& get_compiler() {
    std::lock_guard lock(compiler_mutex);
    if (!compiler) {
      compiler = std::make_unique<compile::Compiler>(settings.nvrtc_library,
                                                     settings.resolved_cuda_home());
    }
    return *compiler;
  }

  // Null when the disk cache is turned off by settings.
  cache::DiskCache* get_disk(const compile::Compiler& nvrtc) {
    if (settings.disable_disk_cache) return nullptr;
    std::lock_guard lock(compiler_mutex);
    if (!disk) {
      disk = std::make_unique<cache::DiskCache>(settings.resolved_cache_dir(), nvrtc.identity().id);
    }
    // Even after a failed write turned the cache memory-only, entries already on disk stay
    // readable: load() checks readability itself, store() and lock() become no-ops.
    return disk.get();
  }

  cache::KeyMaterial key_material(const KernelSpec& spec, const compile::Compiler& nvrtc) {
    cache::KeyMaterial material;
    material.add("schema", std::to_string(cache::kKeySchemaVersion));
    material.add("templates", codegen::template_set_digest());
    material.add("source", codegen::stub_source(spec));
    std::string options;
    for (const std::string& option : nvrtc.options_for(spec)) options += option + "\n";
    material.add("options", options);
    material.add("arch", spec.arch.str());
    material.add("compiler", nvrtc.identity().material);
    material.add("spec", spec.str());
    return material;
  }

  std::shared_ptr<const CompiledKernel> produce(const KernelSpec& spec, KernelSource* source) {
    // Bundles first: a deployment that ships them never loads NVRTC.
    if (auto hit = bundles.find(spec)) {
      bundle_hits.fetch_add(1, std::memory_order_relaxed);
      if (source) *source = KernelSource::bundle;
      return hit;
    }
    if (settings.disable_jit) throw KernelNotInBundle(bundles.miss_message(spec));
    compile::Compiler& nvrtc = get_compiler();
    const cache::KeyMaterial material = key_material(spec, nvrtc);
    const support::Hash128 key = material.key();
    const std::string arch = spec.arch.str();
    cache::DiskCache* cache = get_disk(nvrtc);
    const auto from_disk = [&]() -> std::shared_ptr<const CompiledKernel> {
      auto hit = cache->load(key, arch);
      if (!hit) return nullptr;
      disk_hits.fetch_add(1, std::memory_order_relaxed);
      if (source) *source = KernelSource::disk;
      return std::make_shared<const CompiledKernel>(std::move(*hit));
    };
    if (cache != nullptr) {
      if (auto hit = from_disk()) return hit;
    }
    // Another process may be compiling the same key: wait for it, then look again.
    cache::KeyLock lock;
    if (cache != nullptr) {
      lock = cache->lock(key, arch);
      if (auto hit = from_disk()) return hit;
    }
    support::log(LogLevel::info, "compiling {} (not in any cache)", spec.str());
    const auto start = Clock::now();
    CompiledKernel kernel = nvrtc.compile(spec);
    kernel.key = key.hex();
    kernel.key_material = material.text();
    compiles.fetch_add(1, std::memory_order_relaxed);
    support::log(LogLevel::debug, "compiled {} in {:.1f} ms: {} registers, {} bytes spilled",
                 spec.str(), ms_since(start), kernel.resources.registers,
                 kernel.resources.spill_store_bytes);
    if (cache != nullptr) cache->store(key, arch, kernel);
    if (source) *source = KernelSource::compiled;
    return std::make_shared<const CompiledKernel>(std::move(kernel));
  }

  void throw_if_faulted() {
    if (faulted.load(std::memory_order_acquire)) {
      std::lock_guard lock(fault_mutex);
      throw DriverError(fault_message);
    }
  }

  // Launch errors that poison the context make every later call fail with the same story.
  [[noreturn]] void report_launch_error(const DriverError& error) {
    if (driver::is_sticky(static_cast<CUresult>(error.result()))) {
      std::lock_guard lock(fault_mutex);
      fault_message = fmt::format(
          "the device reported a sticky fault ({}); the CUDA context is unusable and this "
          "process must restart before launching again",
          error.what());
      faulted.store(true, std::memory_order_release);
      throw DriverError(fault_message, error.result(), error.call());
    }
    throw error;
  }
};

Runtime::Runtime(Settings settings) : impl_(std::make_unique<Impl>(std::move(settings))) {}
Runtime::~Runtime() = default;

Runtime& Runtime::global() {
  // Never destroyed: kernels may still be launched from other static destructors, and CUDA
  // libraries must not be unloaded after the driver has shut down.
  static Runtime* runtime = new Runtime(Settings::from_env());
  return *runtime;
}

const Settings& Runtime::settings() const noexcept { return impl_->settings; }

std::shared_ptr<const CompiledKernel> Runtime::compiled(const KernelSpec& spec,
                                                        KernelSource* source) {
  const std::string text = spec.str();
  std::promise<std::shared_ptr<const CompiledKernel>> promise;
  std::shared_future<std::shared_ptr<const CompiledKernel>> future;
  bool producer = false;
  {
    std::lock_guard lock(impl_->compiled_mutex);
    auto it = impl_->compiled.find(text);
    if (it == impl_->compiled.end()) {
      future = promise.get_future().share();
      impl_->compiled.emplace(text, future);
      producer = true;
    } else {
      future = it->second;
    }
  }
  if (!producer) {
    auto kernel = future.get();  // rethrows the producer's error
    impl_->memory_hits.fetch_add(1, std::memory_order_relaxed);
    if (source) *source = KernelSource::memory;
    return kernel;
  }
  try {
    auto kernel = impl_->produce(spec, source);
    promise.set_value(kernel);
    return kernel;
  } catch (...) {
    promise.set_exception(std::current_exception());
    // Forget the failure so that a later call (say, after fixing KJIT_CUDA_HOME) tries again.
    std::lock_guard lock(impl_->compiled_mutex);
    impl_->compiled.erase(text);
    throw;
  }
}

bool Runtime::driver_available(std::string* why) {
  std::string reason;
  if (!driver::driver_loadable(impl_->settings.cuda_driver_library, &reason)) {
    if (why) *why = reason;
    return false;
  }
  if (device_count() == 0) {
    if (why) *why = "the CUDA driver reports no device";
    return false;
  }
  return true;
}

int Runtime::device_count() {
  const driver::DriverApi& cu = driver::driver_api(impl_->settings.cuda_driver_library);
  int count = 0;
  driver::check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

int Runtime::current_device() {
  const driver::DriverApi& cu = driver::driver_api(impl_->settings.cuda_driver_library);
  CUcontext context = nullptr;
  if (cu.cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr) return 0;
  CUdevice device = 0;
  driver::check(cu.cuCtxGetDevice(&device), "cuCtxGetDevice");
  return static_cast<int>(device);
}

DeviceLimits Runtime::device_limits(int device) {
  std::lock_guard lock(impl_->limits_mutex);
  auto it = impl_->device_limits.find(device);
  if (it != impl_->device_limits.end()) return it->second;
  driver::driver_api(impl_->settings.cuda_driver_library);
  const int count = device_count();
  if (device < 0 || device >= count) {
    throw InvalidArgument(
        fmt::format("device {} does not exist; this process sees {} device(s)", device, count));
  }
  DeviceLimits limits = driver::query_device_limits(device);
  impl_->device_limits.emplace(device, limits);
  return limits;
}

const LoadedKernel& Runtime::load(const KernelSpec& spec, int device, Stream stream) {
  impl_->throw_if_faulted();
  const std::pair<std::string, int> id(spec.str(), device);
  {
    std::lock_guard lock(impl_->loaded_mutex);
    if (auto it = impl_->loaded.find(id); it != impl_->loaded.end()) return *it->second;
  }
  const DeviceLimits limits = device_limits(device);
  if (limits.arch.sm() != spec.arch.sm()) {
    throw InvalidArgument(fmt::format(
        "{} was specialized for {}, but device {} is {} ({}): plan for the device's arch",
        spec.str(), spec.arch.str(), device, limits.arch.str(), limits.name));
  }
  if (stream != nullptr && !impl_->settings.allow_compile_in_capture &&
      driver::stream_is_capturing(reinterpret_cast<CUstream>(stream))) {
    throw DriverError(fmt::format(
        "{} is not loaded on device {} and the stream is capturing a CUDA graph: compiling or "
        "loading during capture would stall or break the capture. Call kjit prewarm (or run "
        "the op once) before capturing, or set KJIT_ALLOW_COMPILE_IN_CAPTURE=1",
        spec.str(), device));
  }
  auto compiled_kernel = compiled(spec);
  auto kernel = std::make_unique<LoadedKernel>();
  {
    // The primary context of the device must be current while its function handle is made.
    std::unique_lock lock(impl_->limits_mutex);
    auto& context = impl_->contexts[device];
    if (!context) context = std::make_unique<driver::PrimaryContext>(device);
    lock.unlock();
    driver::ScopedContext scoped(context->get());
    kernel->compiled = compiled_kernel;
    kernel->device = device;
    kernel->device_limits = limits;
    kernel->library = driver::LoadedLibrary(compiled_kernel->cubin);
    kernel->function = kernel->library.function(compiled_kernel->lowered_name);
    kernel->limits = driver::function_limits(kernel->function);
  }
  std::lock_guard lock(impl_->loaded_mutex);
  // Another thread may have loaded it meanwhile; keep the first so pointers stay unique.
  auto [it, inserted] = impl_->loaded.emplace(id, std::move(kernel));
  return *it->second;
}

void Runtime::prewarm(const std::vector<KernelSpec>& specs, int device) {
  for (const KernelSpec& spec : specs) load(spec, device, nullptr);
}

FunctionLimits Runtime::function_limits(const LoadedKernel& kernel) const { return kernel.limits; }

void Runtime::launch(const LoadedKernel& kernel, const LaunchShape& shape, Stream stream,
                     const void* params, std::size_t params_size) {
  impl_->throw_if_faulted();
  // The device's limits were taken when the kernel was loaded: no lock and no copy here, and
  // the error text is only built when a check fails.
  const std::vector<LimitCheck> checks = check_launch(shape, kernel.device_limits, kernel.limits);
  if (!std::all_of(checks.begin(), checks.end(), [](const LimitCheck& c) { return c.ok(); })) {
    require_legal(checks, fmt::format("{} launch", kernel.compiled->spec.str()));
  }
  (void)params_size;
  void* args[] = {const_cast<void*>(params)};
  try {
    driver::launch(kernel.function, shape, reinterpret_cast<CUstream>(stream), args);
  } catch (const DriverError& error) {
    impl_->report_launch_error(error);
  }
}

Runtime::ResolvedPlan Runtime::resolve(Plan plan, int device, Stream stream) {
  ResolvedPlan resolved;
  resolved.device = device;
  const DeviceLimits limits = device_limits(device);
  for (std::size_t i = 0; i < plan.launches.size(); ++i) {
    PlannedLaunch& planned = plan.launches[i];
    const LoadedKernel& kernel = load(planned.spec, device, stream);
    // The final check: the same shape against the function as the driver loaded it.
    planned.checks = check_launch(planned.shape, limits, kernel.limits);
    require_legal(planned.checks, fmt::format("{} launch {} of {} ({})", plan.op, i + 1,
                                              plan.launches.size(), planned.spec.str()));
    resolved.kernels.push_back(&kernel);
  }
  resolved.plan = std::move(plan);
  return resolved;
}

void Runtime::launch(const ResolvedPlan& resolved, std::size_t index, Stream stream,
                     const void* params, std::size_t /*params_size*/) {
  if (impl_->faulted.load(std::memory_order_relaxed)) impl_->throw_if_faulted();
  void* args[] = {const_cast<void*>(params)};
  try {
    driver::launch(resolved.kernels[index]->function, resolved.plan.launches[index].shape,
                   reinterpret_cast<CUstream>(stream), args);
  } catch (const DriverError& error) {
    impl_->report_launch_error(error);
  }
}

const Runtime::ResolvedPlan* Runtime::find_memo(std::string_view signature) const {
  std::shared_lock lock(impl_->memo_mutex);
  auto it = impl_->memo.find(signature);
  return it == impl_->memo.end() ? nullptr : it->second.get();
}

const Runtime::ResolvedPlan& Runtime::insert_memo(std::string_view signature,
                                                  ResolvedPlan resolved) {
  std::unique_lock lock(impl_->memo_mutex);
  auto [it, inserted] = impl_->memo.emplace(std::string(signature),
                                            std::make_unique<ResolvedPlan>(std::move(resolved)));
  return *it->second;
}

CacheStats Runtime::stats() const {
  CacheStats stats;
  stats.memory_hits = impl_->memory_hits.load();
  stats.bundle_hits = impl_->bundle_hits.load();
  stats.disk_hits = impl_->disk_hits.load();
  stats.compiles = impl_->compiles.load();
  std::lock_guard lock(impl_->compiler_mutex);
  if (impl_->disk) {
    stats.corrupt_entries = impl_->disk->corrupt_entries();
    stats.write_failures = impl_->disk->write_failures();
    stats.disk_enabled = impl_->disk->enabled();
  } else {
    stats.disk_enabled = !impl_->settings.disable_disk_cache;
  }
  return stats;
}

}  // namespace kjit
