// SPDX-License-Identifier: Apache-2.0
// The facade: spec -> (memory | disk cache | NVRTC) -> loaded function per device -> checked
// launch. Everything here is thread-safe; the steady-state launch path takes no lock beyond a
// shared one for the plan memo.
#include "kjit/runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <utility>

#include "cache/bundle.hpp"
#include "cache/compiler_memo.hpp"
#include "cache/disk_cache.hpp"
#include "cache/entry.hpp"
#include "cache/key.hpp"
#include "codegen/embedded_templates.hpp"
#include "codegen/families.hpp"
#include "compile/compiler.hpp"
#include "driver/context.hpp"
#include "driver/driver_api.hpp"
#include "driver/launch.hpp"
#include "driver/memory.hpp"
#include "kjit/error.hpp"
#include "runtime/loaded_kernel.hpp"
#include "support/log.hpp"

namespace kjit {

namespace {

// Devices whose primary context is tracked lock-free; a process with more devices still works,
// but device_of() then names such a device only through the slower lookup.
constexpr int kMaxDevices = 64;

// The special handles that mean "the default stream of the current context".
bool is_default_stream(Stream stream) {
  const auto handle = reinterpret_cast<std::uintptr_t>(stream);
  return handle == 0 || handle == reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY) ||
         handle == reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD);
}

// Lets the plan memo be searched with a string_view of signature bytes, allocation-free.
struct SignatureHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view bytes) const noexcept {
    return std::hash<std::string_view>{}(bytes);
  }
};

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
  std::atomic<bool> nvrtc_loaded{false};
  // One disk cache per compiler id: normally one, two when a remembered identity turned out
  // to differ from the loaded compiler's.
  std::map<std::string, std::unique_ptr<cache::DiskCache>> disks;
  // The compiler identity remembered next to the cache (read once), so that a warm start finds
  // its kernels without loading NVRTC; see cache/compiler_memo.hpp.
  std::once_flag memo_once;
  std::optional<cache::CompilerMemo> compiler_memo;
  std::once_flag selector_once;
  std::string selector;
  bool memo_written = false;  // guarded by compiler_mutex

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
  // The primary context of each device once retained, readable without a lock: the per-call
  // device lookup (device_of) and the launch-time context check scan this.
  std::array<std::atomic<CUcontext>, kMaxDevices> primary{};
  // Serializes library loads per device, so a kernel is loaded once per device even when
  // threads race for it; loads on different devices run in parallel.
  std::map<int, std::unique_ptr<std::mutex>> load_mutexes;

  mutable std::shared_mutex memo_mutex;
  std::unordered_map<std::string, std::unique_ptr<ResolvedPlan>, SignatureHash, std::equal_to<>>
      memo;

  std::atomic<std::uint64_t> memory_hits{0};
  std::atomic<std::uint64_t> bundle_hits{0};
  std::atomic<std::uint64_t> disk_hits{0};
  std::atomic<std::uint64_t> compiles{0};
  std::atomic<std::uint64_t> loads{0};

  // A sticky fault poisons one device's context, not the others': one bit per device (devices
  // past 63 share the last bit, which errs on the side of refusing), and its message.
  std::atomic<std::uint64_t> faulted{0};
  std::mutex fault_mutex;
  std::map<int, std::string> fault_messages;

  static std::uint64_t fault_bit(int device) {
    return std::uint64_t{1} << std::min(std::max(device, 0), 63);
  }

  compile::Compiler& get_compiler() {
    std::lock_guard lock(compiler_mutex);
    if (!compiler) {
      compiler = std::make_unique<compile::Compiler>(settings.nvrtc_library,
                                                     settings.resolved_cuda_home());
      nvrtc_loaded.store(true, std::memory_order_release);
    }
    return *compiler;
  }

  // What chose the NVRTC library file: the memo is only valid for the same choice. An NVRTC
  // the process already loaded (torch brings its own) is what dlopen returns, whatever the
  // search path says.
  std::string memo_selector() {
    // Computed once, before this runtime loads NVRTC itself (which would then count as
    // preloaded): reads and writes of one runtime use the same memo.
    std::call_once(selector_once, [&] { selector = compute_memo_selector(); });
    return selector;
  }

  std::string compute_memo_selector() const {
    const char* path = std::getenv("LD_LIBRARY_PATH");
    return fmt::format("nvrtc_library={};cuda_home={};LD_LIBRARY_PATH={};preloaded={}",
                       settings.nvrtc_library, settings.resolved_cuda_home(),
                       path != nullptr ? path : "",
                       preloaded_nvrtc(settings.nvrtc_library, settings.resolved_cuda_home()));
  }

  // Whether someone else had loaded NVRTC before kjit first asked in this process: decided once
  // per process (and library setting), so that every runtime of a process, and a fresh process
  // of the same kind, use the same memo; kjit's own loads never count.
  static std::string preloaded_nvrtc(const std::string& library, const std::string& cuda_home) {
    static std::mutex mutex;
    static std::map<std::pair<std::string, std::string>, std::string> seen;
    std::lock_guard lock(mutex);
    auto [it, inserted] = seen.try_emplace({library, cuda_home});
    if (inserted) it->second = compile::Compiler::preloaded_library_file(library, cuda_home);
    return it->second;
  }

  const cache::CompilerMemo* remembered_identity() {
    if (settings.disable_disk_cache) return nullptr;
    std::call_once(memo_once, [&] {
      compiler_memo = cache::read_compiler_memo(settings.resolved_cache_dir(), memo_selector());
    });
    return compiler_memo ? &*compiler_memo : nullptr;
  }

  // After NVRTC was loaded: remembers its identity for the next process, once per runtime.
  void remember_identity(const compile::Compiler& nvrtc, cache::DiskCache* cache) {
    if (cache == nullptr || !cache->enabled()) return;
    const compile::CompilerIdentity& id = nvrtc.identity();
    {
      std::lock_guard lock(compiler_mutex);
      if (memo_written) return;
      memo_written = true;
    }
    const cache::CompilerMemo* known = remembered_identity();
    if (known != nullptr && known->id == id.id && known->material == id.material) return;
    cache::write_compiler_memo(settings.resolved_cache_dir(), memo_selector(), nvrtc.library_file(),
                               cache::CompilerMemo{id.id, id.material});
  }

  // Null when the disk cache is turned off by settings.
  cache::DiskCache* get_disk(const std::string& compiler_id) {
    if (settings.disable_disk_cache) return nullptr;
    std::lock_guard lock(compiler_mutex);
    std::unique_ptr<cache::DiskCache>& disk = disks[compiler_id];
    if (!disk)
      disk = std::make_unique<cache::DiskCache>(settings.resolved_cache_dir(), compiler_id);
    // Even after a failed write turned the cache memory-only, entries already on disk stay
    // readable: load() checks readability itself, store() and lock() become no-ops.
    return disk.get();
  }

  cache::KeyMaterial key_material(const KernelSpec& spec, const std::string& compiler_material) {
    cache::KeyMaterial material;
    material.add("schema", std::to_string(cache::kKeySchemaVersion));
    material.add("templates", codegen::template_set_digest());
    material.add("source", codegen::stub_source(spec));
    std::string options;
    for (const std::string& option : compile::Compiler::canonical_options(spec)) {
      options += option + "\n";
    }
    material.add("options", options);
    material.add("arch", spec.arch.str());
    material.add("compiler", compiler_material);
    material.add("spec", spec.str());
    return material;
  }

  std::shared_ptr<const CompiledKernel> disk_hit(cache::DiskCache* cache,
                                                 const support::Hash128& key,
                                                 const KernelSpec& spec, KernelSource* source) {
    if (cache == nullptr) return nullptr;
    const std::string arch = spec.arch.str();
    auto hit = cache->load(key, arch);
    if (!hit) return nullptr;
    disk_hits.fetch_add(1, std::memory_order_relaxed);
    if (source) *source = KernelSource::disk;
    support::log(LogLevel::debug, "{}: from the disk cache, {}", spec.str(),
                 cache->entry_path(key, arch));
    return std::make_shared<const CompiledKernel>(std::move(*hit));
  }

  std::shared_ptr<const CompiledKernel> produce(const KernelSpec& spec, KernelSource* source) {
    // Bundles first: a deployment that ships them never loads NVRTC.
    std::string bundle_path;
    if (auto hit = bundles.find(spec, &bundle_path)) {
      bundle_hits.fetch_add(1, std::memory_order_relaxed);
      if (source) *source = KernelSource::bundle;
      support::log(LogLevel::debug, "{}: from bundle {}", spec.str(), bundle_path);
      return hit;
    }
    // A warm start: the remembered compiler identity gives the key, and a hit needs no NVRTC.
    const cache::CompilerMemo* known = nullptr;
    if (!nvrtc_loaded.load(std::memory_order_acquire)) {
      if ((known = remembered_identity())) {
        const support::Hash128 key = key_material(spec, known->material).key();
        if (auto hit = disk_hit(get_disk(known->id), key, spec, source)) return hit;
      }
    }
    if (settings.disable_jit) return cached_without_jit(spec, known, source);
    compile::Compiler& nvrtc = get_compiler();
    const cache::KeyMaterial material = key_material(spec, nvrtc.identity().material);
    const support::Hash128 key = material.key();
    cache::DiskCache* cache = get_disk(nvrtc.identity().id);
    remember_identity(nvrtc, cache);
    if (auto hit = disk_hit(cache, key, spec, source)) return hit;
    // Another process may be compiling the same key: wait for it, then look again.
    const std::string arch = spec.arch.str();
    cache::KeyLock lock;
    if (cache != nullptr) {
      lock = cache->lock(key, arch);
      if (auto hit = disk_hit(cache, key, spec, source)) return hit;
    }
    // The one line of this resolution (DESIGN: one log line before any compile).
    support::log(LogLevel::info, "{}: compiling with NVRTC (in no bundle or disk cache)",
                 spec.str());
    CompiledKernel kernel = nvrtc.compile(spec);
    // ptxas's timings would make two builds of one kernel different bytes.
    kernel.log = cache::reproducible_log(kernel.log);
    kernel.key = key.hex();
    kernel.key_material = material.text();
    compiles.fetch_add(1, std::memory_order_relaxed);
    if (cache != nullptr) cache->store(key, arch, kernel);
    if (source) *source = KernelSource::compiled;
    return std::make_shared<const CompiledKernel>(std::move(kernel));
  }

  // JIT disabled and no bundle holds `spec`: the disk cache is searched under every compiler
  // identity remembered in it (`known`, already searched, first), without loading NVRTC.
  // Nothing will be compiled, so a cache filled by another compiler (or copied from another
  // machine, where the memo's selector differs) serves its kernels all the same.
  std::shared_ptr<const CompiledKernel> cached_without_jit(const KernelSpec& spec,
                                                           const cache::CompilerMemo* known,
                                                           KernelSource* source) {
    if (settings.disable_disk_cache) {
      throw KernelNotInBundle(
          bundles.miss_message(spec, "the disk cache is turned off (KJIT_DISABLE_DISK_CACHE=1)"));
    }
    const std::string root = settings.resolved_cache_dir();
    const std::vector<cache::CompilerMemo> memos = cache::read_all_compiler_memos(root);
    for (const cache::CompilerMemo& remembered : memos) {
      if (known != nullptr && remembered.id == known->id &&
          remembered.material == known->material) {
        continue;
      }
      const support::Hash128 key = key_material(spec, remembered.material).key();
      if (auto hit = disk_hit(get_disk(remembered.id), key, spec, source)) return hit;
    }
    throw KernelNotInBundle(bundles.miss_message(
        spec, memos.empty()
                  ? fmt::format("not in the disk cache {} (it remembers no compiler, so it "
                                "holds no kernel kjit compiled)",
                                root)
                  : fmt::format("not in the disk cache {} (searched the kernels of {} "
                                "compiler identit{})",
                                root, memos.size(), memos.size() == 1 ? "y" : "ies")));
  }

  void throw_if_faulted(int device) {
    if ((faulted.load(std::memory_order_acquire) & fault_bit(device)) != 0) {
      std::lock_guard lock(fault_mutex);
      auto it = fault_messages.find(device);
      throw DriverError(it != fault_messages.end()
                            ? it->second
                            : fmt::format("device {} reported a sticky fault earlier", device));
    }
  }

  // Launch errors that poison a device's context make every later call on that device fail
  // with the same story; other devices keep working.
  [[noreturn]] void report_launch_error(const DriverError& error, int device) {
    if (driver::is_sticky(static_cast<CUresult>(error.result()))) {
      std::lock_guard lock(fault_mutex);
      std::string& message = fault_messages[device];
      message = fmt::format(
          "device {} reported a sticky fault ({}); its CUDA context is unusable and this "
          "process must restart before launching on it again",
          device, error.what());
      faulted.fetch_or(fault_bit(device), std::memory_order_release);
      throw DriverError(message, error.result(), error.call());
    }
    throw error;
  }

  // The retained primary context of `device`, retaining it on first use.
  CUcontext primary_context(int device) {
    if (device >= 0 && device < kMaxDevices) {
      if (CUcontext known = primary[device].load(std::memory_order_acquire)) return known;
    }
    std::lock_guard lock(limits_mutex);
    auto& context = contexts[device];
    if (!context) context = std::make_unique<driver::PrimaryContext>(device);
    if (device >= 0 && device < kMaxDevices) {
      primary[device].store(context->get(), std::memory_order_release);
    }
    return context->get();
  }

  // The device whose retained primary context is `context`, or -1.
  int device_of_primary(CUcontext context) const {
    for (int device = 0; device < kMaxDevices; ++device) {
      const CUcontext known = primary[device].load(std::memory_order_acquire);
      if (known == context) return device;
    }
    return -1;
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

int Runtime::device_of(Stream stream, int requested) {
  const driver::DriverApi& cu = driver::driver_api(impl_->settings.cuda_driver_library);
  CUcontext context = nullptr;
  if (is_default_stream(stream)) {
    // The default stream of whatever device is asked for: launch() makes that device's primary
    // context current for the launch when another one is.
    if (requested >= 0) return requested;
    if (cu.cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr) return 0;
  } else {
    driver::check(cu.cuStreamGetCtx(reinterpret_cast<CUstream>(stream), &context),
                  "cuStreamGetCtx");
  }
  int device = impl_->device_of_primary(context);
  if (device < 0) {
    // Not a context seen before: ask the driver which device it is on (switching to it for the
    // question), then whether it is that device's primary context.
    CUdevice ordinal = 0;
    {
      driver::ScopedContext scoped(context);
      driver::check(cu.cuCtxGetDevice(&ordinal), "cuCtxGetDevice");
    }
    device = static_cast<int>(ordinal);
    if (impl_->primary_context(device) != context) {
      throw InvalidArgument(fmt::format(
          "stream {}: its CUDA context ({}) on device {} is not the device's primary context; "
          "kjit loads kernels into primary contexts (those the CUDA runtime and PyTorch use), "
          "so a stream of another context cannot run them. Use a stream created in the primary "
          "context (cudaStreamCreate, torch.cuda.Stream)",
          is_default_stream(stream) ? "default" : fmt::format("{}", static_cast<void*>(stream)),
          static_cast<void*>(context), device));
    }
  }
  if (requested >= 0 && requested != device) {
    throw InvalidArgument(fmt::format(
        "options.device = {}, but stream {} belongs to device {}: pass a stream of device {}, "
        "or leave options.device at -1 to run on the stream's device",
        requested, static_cast<void*>(stream), device, requested));
  }
  return device;
}

// Checked before the driver so that a refusal names the field and its value, and so that the driver
// never sees a request it fails (compute-sanitizer counts each failed driver call as an error).
std::string tensor_map_refusal(const TensorMapRequest& r) {
  if (r.rank < 1 || r.rank > 5) return fmt::format("rank {} (1 to 5)", r.rank);
  if (r.swizzle_bytes != 0 && r.swizzle_bytes != 32 && r.swizzle_bytes != 64 &&
      r.swizzle_bytes != 128) {
    return fmt::format("swizzle of {} bytes (0, 32, 64 or 128)", r.swizzle_bytes);
  }
  const std::uint64_t element = size_of(r.element);
  if (reinterpret_cast<std::uintptr_t>(r.base) % 16 != 0) {
    return fmt::format("base {} is not 16-byte aligned", r.base);
  }
  for (int d = 0; d < r.rank; ++d) {
    if (r.dims[d] == 0 || r.dims[d] > (std::uint64_t{1} << 32)) {
      return fmt::format("dims[{}] = {} (1 to 2^32)", d, r.dims[d]);
    }
    if (r.box[d] == 0 || r.box[d] > 256) return fmt::format("box[{}] = {} (1 to 256)", d, r.box[d]);
    if (d > 0 && (r.strides[d - 1] == 0 || r.strides[d - 1] % 16 != 0 ||
                  r.strides[d - 1] >= (std::uint64_t{1} << 40))) {
      return fmt::format("strides[{}] = {} bytes (a positive multiple of 16 below 2^40)", d - 1,
                         r.strides[d - 1]);
    }
  }
  const std::uint64_t row_bytes = r.box[0] * element;
  if (row_bytes % 16 != 0) {
    return fmt::format("box[0] = {} elements of {} bytes: {} bytes, not a multiple of 16", r.box[0],
                       element, row_bytes);
  }
  if (r.swizzle_bytes != 0 && row_bytes > static_cast<std::uint64_t>(r.swizzle_bytes)) {
    return fmt::format(
        "box[0] = {} elements of {} bytes: {}-byte rows under a {}-byte swizzle "
        "(at most the swizzle's span)",
        r.box[0], element, row_bytes, r.swizzle_bytes);
  }
  return {};
}

bool Runtime::encode_tensor_map(const TensorMapRequest& request, void* map, std::string* why) {
  // (The driver writes the map with 64-byte stores: a misaligned one is a caller's bug, not a
  // request the driver refuses.)
  if (map == nullptr || reinterpret_cast<std::uintptr_t>(map) % alignof(CUtensorMap) != 0) {
    throw InvalidArgument(
        fmt::format("encode_tensor_map: map {} is not a {}-byte aligned CUtensorMap of {} bytes",
                    map, alignof(CUtensorMap), sizeof(CUtensorMap)));
  }
  const auto refuse = [&](const std::string& text) {
    if (why != nullptr) *why = text;
    std::memset(map, 0, sizeof(CUtensorMap));
    return false;
  };
  if (std::string problem = tensor_map_refusal(request); !problem.empty()) {
    return refuse(std::move(problem));
  }
  const driver::DriverApi& api = driver::driver_api(impl_->settings.cuda_driver_library);
  CUtensorMapDataType type;
  switch (request.element) {
    case DType::bf16:
      type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
      break;
    case DType::f16:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
      break;
    case DType::f32:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
      break;
    default:
      return refuse(fmt::format("element type {}", to_string(request.element)));
  }
  CUtensorMapSwizzle swizzle;
  switch (request.swizzle_bytes) {
    case 0:
      swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
      break;
    case 32:
      swizzle = CU_TENSOR_MAP_SWIZZLE_32B;
      break;
    case 64:
      swizzle = CU_TENSOR_MAP_SWIZZLE_64B;
      break;
    case 128:
      swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
      break;
    default:
      return refuse(fmt::format("swizzle of {} bytes", request.swizzle_bytes));
  }
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = api.cuTensorMapEncodeTiled(
      static_cast<CUtensorMap*>(map), type, static_cast<cuuint32_t>(request.rank),
      const_cast<void*>(request.base), reinterpret_cast<const cuuint64_t*>(request.dims),
      reinterpret_cast<const cuuint64_t*>(request.strides),
      reinterpret_cast<const cuuint32_t*>(request.box), element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return refuse(fmt::format("cuTensorMapEncodeTiled: {}", driver::describe(r)));
  return true;
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
  impl_->throw_if_faulted(device);
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
  // Compiling is single-flight across devices and needs no context; only the load is per device.
  auto compiled_kernel = compiled(spec);
  const CUcontext context = impl_->primary_context(device);
  std::mutex* device_load_mutex = nullptr;
  {
    std::lock_guard lock(impl_->loaded_mutex);
    auto& slot = impl_->load_mutexes[device];
    if (!slot) slot = std::make_unique<std::mutex>();
    device_load_mutex = slot.get();
  }
  std::lock_guard load_lock(*device_load_mutex);
  {
    // Another thread may have loaded it while this one compiled or waited.
    std::lock_guard lock(impl_->loaded_mutex);
    if (auto it = impl_->loaded.find(id); it != impl_->loaded.end()) return *it->second;
  }
  auto kernel = std::make_unique<LoadedKernel>();
  {
    // The primary context of the device must be current while its function handle is made.
    driver::ScopedContext scoped(context);
    kernel->compiled = compiled_kernel;
    kernel->device = device;
    kernel->context = context;
    kernel->device_limits = limits;
    kernel->library = driver::LoadedLibrary(compiled_kernel->cubin);
    kernel->function = kernel->library.function(compiled_kernel->lowered_name);
    kernel->limits = driver::function_limits(kernel->function);
  }
  impl_->loads.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(impl_->loaded_mutex);
  auto [it, inserted] = impl_->loaded.emplace(id, std::move(kernel));
  return *it->second;
}

void Runtime::prewarm(const std::vector<KernelSpec>& specs, int device) {
  for (const KernelSpec& spec : specs) load(spec, device, nullptr);
}

FunctionLimits Runtime::function_limits(const LoadedKernel& kernel) const { return kernel.limits; }

namespace {

// Launches `function` (made in `context`) on `stream`, never on a stream of another context:
// a real stream must belong to `context`; the default stream is taken as `context`'s, which is
// made current for the launch when another context is.
void launch_in_context(const driver::DriverApi& cu, CUcontext context, int device,
                       const LoadedKernel& kernel, const LaunchShape& shape, Stream stream,
                       void** args) {
  const CUfunction function = kernel.function;
  const auto static_smem = static_cast<std::uint32_t>(kernel.limits.static_smem);
  if (is_default_stream(stream)) {
    CUcontext current = nullptr;
    (void)cu.cuCtxGetCurrent(&current);
    if (current != context) {
      driver::ScopedContext scoped(context);
      driver::launch(function, shape, static_smem, reinterpret_cast<CUstream>(stream), args);
      return;
    }
  } else {
    CUcontext owner = nullptr;
    driver::check(cu.cuStreamGetCtx(reinterpret_cast<CUstream>(stream), &owner), "cuStreamGetCtx");
    if (owner != context) {
      throw InvalidArgument(fmt::format(
          "stream {} belongs to CUDA context {}, not to the primary context of device {} that "
          "the kernel was loaded in: launching it there would use one device's function handle "
          "on another. Pass options.device matching the stream (or -1), or a stream of device {}",
          static_cast<void*>(stream), static_cast<void*>(owner), device, device));
    }
  }
  driver::launch(function, shape, static_smem, reinterpret_cast<CUstream>(stream), args);
}

}  // namespace

void Runtime::launch(const LoadedKernel& kernel, const LaunchShape& shape, Stream stream,
                     const void* params, std::size_t params_size) {
  impl_->throw_if_faulted(kernel.device);
  // The device's limits were taken when the kernel was loaded: no lock and no copy here, and
  // the error text is only built when a check fails.
  const std::vector<LimitCheck> checks = check_launch(shape, kernel.device_limits, kernel.limits);
  if (!std::all_of(checks.begin(), checks.end(), [](const LimitCheck& c) { return c.ok(); })) {
    require_legal(checks, fmt::format("{} launch", kernel.compiled->spec.str()));
  }
  (void)params_size;
  void* args[] = {const_cast<void*>(params)};
  try {
    launch_in_context(driver::loaded_api(), kernel.context, kernel.device, kernel, shape, stream,
                      args);
  } catch (const DriverError& error) {
    impl_->report_launch_error(error, kernel.device);
  }
}

Runtime::ResolvedPlan Runtime::resolve(Plan plan, int device, Stream stream) {
  ResolvedPlan resolved;
  resolved.device = device;
  const DeviceLimits limits = device_limits(device);  // InvalidArgument for a bad ordinal
  resolved.context = impl_->primary_context(device);
  for (std::size_t i = 0; i < plan.launches.size(); ++i) {
    PlannedLaunch& planned = plan.launches[i];
    // An overlap also needs the device to have it: a plan made for one arch may be resolved on
    // another device only through the same checks.
    if (impl_->settings.disable_programmatic_launch || !supports_programmatic_launch(limits.arch)) {
      planned.shape.overlaps_previous = false;
    }
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
  if (impl_->faulted.load(std::memory_order_relaxed) != 0) {
    impl_->throw_if_faulted(resolved.device);
  }
  void* args[] = {const_cast<void*>(params)};
  try {
    launch_in_context(driver::loaded_api(), static_cast<CUcontext>(resolved.context),
                      resolved.device, *resolved.kernels[index],
                      resolved.plan.launches[index].shape, stream, args);
  } catch (const DriverError& error) {
    impl_->report_launch_error(error, resolved.device);
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

Workspace Runtime::workspace(const ResolvedPlan& resolved, std::size_t bytes, Stream stream,
                             const char* what) {
  Workspace workspace;
  if (bytes == 0) return workspace;
  const CUstream cu_stream = reinterpret_cast<CUstream>(stream);
  driver::ScopedContext scoped(static_cast<CUcontext>(resolved.context));
  const CUdeviceptr ptr = driver::allocate_workspace(resolved.device, bytes, cu_stream, what);
  workspace.data_ = reinterpret_cast<void*>(ptr);
  workspace.size_ = bytes;
  workspace.context_ = resolved.context;
  workspace.stream_ = stream;
  return workspace;
}

bool Runtime::capturing(Stream stream) {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  driver::check(
      driver::driver_api().cuStreamIsCapturing(reinterpret_cast<CUstream>(stream), &capture),
      "cuStreamIsCapturing");
  return capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

void Runtime::copy_to_host(void* host, const void* device_ptr, std::size_t bytes, Stream stream) {
  const driver::DriverApi& cu = driver::loaded_api();
  driver::check(cu.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "cuStreamSynchronize");
  driver::check(cu.cuMemcpyDtoH(host, reinterpret_cast<CUdeviceptr>(device_ptr), bytes),
                "cuMemcpyDtoH");
}

Workspace::~Workspace() { free_on_stream(false); }

Workspace::Workspace(Workspace&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      context_(other.context_),
      stream_(other.stream_) {}

Workspace& Workspace::operator=(Workspace&& other) noexcept {
  if (this != &other) {
    free_on_stream(false);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    context_ = other.context_;
    stream_ = other.stream_;
  }
  return *this;
}

void Workspace::release() { free_on_stream(true); }

void Workspace::free_on_stream(bool report) {
  if (data_ == nullptr) return;
  const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(std::exchange(data_, nullptr));
  size_ = 0;
  const CUstream cu_stream = reinterpret_cast<CUstream>(stream_);
  if (!report) {
    // The exception path: the launch's error is the one the caller needs to see.
    try {
      driver::ScopedContext scoped(static_cast<CUcontext>(context_));
      (void)driver::loaded_api().cuMemFreeAsync(ptr, cu_stream);
    } catch (...) {
    }
    return;
  }
  driver::ScopedContext scoped(static_cast<CUcontext>(context_));
  driver::check(driver::loaded_api().cuMemFreeAsync(ptr, cu_stream), "cuMemFreeAsync");
}

CacheStats Runtime::stats() const {
  CacheStats stats;
  stats.memory_hits = impl_->memory_hits.load();
  stats.bundle_hits = impl_->bundle_hits.load();
  stats.disk_hits = impl_->disk_hits.load();
  stats.compiles = impl_->compiles.load();
  stats.loads = impl_->loads.load();
  stats.nvrtc_loaded = impl_->nvrtc_loaded.load();
  std::lock_guard lock(impl_->compiler_mutex);
  stats.disk_enabled = !impl_->settings.disable_disk_cache;
  for (const auto& [id, disk] : impl_->disks) {
    stats.corrupt_entries += disk->corrupt_entries();
    stats.write_failures += disk->write_failures();
    stats.disk_enabled = stats.disk_enabled && disk->enabled();
  }
  return stats;
}

}  // namespace kjit
