// SPDX-License-Identifier: Apache-2.0
// A CPU emulation of one sm_90a thread block, enough to run the warp-specialized gdn_prefill
// kernel (templates/gdn_prefill/ws.cuh) as host C++ where no GPU exists, with its
// synchronization taken seriously:
//   - every thread of the block is a fiber on one OS thread (a stack of its own and a context
//     switch of six callee-saved registers on x86-64, ucontext elsewhere); a fiber runs until it
//     must wait (a barrier, an mbarrier phase, a warp-collective operation) or until the
//     scheduler preempts it at a primitive; the next fiber is drawn at random from a seeded
//     generator, so each seed is another legal interleaving, reproducibly;
//   - asynchronous operations complete late, as the hardware may: a cp.async copy lands, and
//     its cp.async.mbarrier.arrive arrives, at a random later step (its destination is poisoned
//     with NaN bytes when it is issued, so that a read before the landing shows); a wgmma reads
//     its shared-memory operands and writes its accumulators only at the wait_group that retires
//     it, so that a tile rewritten before that wait, or an accumulator read before it, gives a
//     wrong result;
//   - named barriers count their threads and compare every arrival's thread count, mbarriers
//     count arrivals and transactions by phase; a block where no fiber can run and nothing is
//     in flight is a deadlock, reported with what every waiting thread waits for.
// Results are compared with the float64 reference by the test; the products are exact f32
// sums, not the tensor cores' rounding.
//
// The templates' inline PTX sits in small functions guarded by KJIT_EMULATED_PTX (defined
// here), which this header defines instead: wgmma, mma.sync, ldmatrix, movmatrix, mbarrier,
// cp.async, named barriers, griddepcontrol, ex2. Include it after every library header and
// before the template, in a translation unit of its own (it defines __CUDA_ARCH__ 900 and
// __CUDA_ARCH_FEAT_SM90_ALL for that unit; its functions have internal linkage).
#pragma once

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define KJIT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/common_interface_defs.h>
#define KJIT_EMU_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define KJIT_EMU_TSAN 1
// (exported by the TSan runtime, not declared by its header)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

// (Defined first: cuda_host_emulation.hpp then leaves __cvta_generic_to_shared to this file.)
#define KJIT_EMULATED_PTX 1
#include "common/cuda_host_emulation.hpp"

#define __CUDA_ARCH__ 900
#define __CUDA_ARCH_FEAT_SM90_ALL 1

#include "templates/common/tensor_map.h"
#include "templates/common/types.h"

// --- the CUDA types and intrinsics the templates use beyond cuda_host_emulation.hpp ----------

struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct __half2 {
  __half x, y;
};
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 v) {
  return {__bfloat162float(v.x), __bfloat162float(v.y)};
}
static inline __half2 __floats2half2_rn(float lo, float hi) {
  return {__float2half_rn(lo), __float2half_rn(hi)};
}
static inline float2 __half22float2(__half2 v) { return {__half2float(v.x), __half2float(v.y)}; }
template <typename T>
static inline T __ldg(const T* p) {
  return *p;
}
static inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
// The warp-specialized kernel's measurement build (KJIT_GDN_WS_PROFILE): a clock that only moves
// forward, and an add (the emulated threads are fibers of one host thread: no two run at once).
static inline long long clock64() {
  static long long ticks = 0;
  return ++ticks;
}
static inline unsigned long long atomicAdd(unsigned long long* cell, unsigned long long v) {
  const unsigned long long old = *cell;
  *cell = old + v;
  return old;
}

#if defined(__x86_64__)
// The context switch: saves the System V callee-saved registers on the current stack, stores its
// stack pointer through the first argument, loads the second and restores from there. glibc's
// swapcontext also switches the signal mask (two system calls each time), and ASan's interceptor
// of it clears the shadow of the whole target stack each time: 46 of the 86 s this test took
// under ASan. (A symbol of its own: include this header in one translation unit.)
extern "C" void kjit_sm90_emulation_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .type kjit_sm90_emulation_switch, @function
kjit_sm90_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kjit_sm90_emulation_switch, .-kjit_sm90_emulation_switch
)");
#endif

namespace kjit_sm90_emulation {

using kjit::u32;
using kjit::u64;

/// A suspended execution context: a saved stack pointer (x86-64) or a ucontext.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc{};
#endif
};

/// Saves the running context into `from` and resumes `to`.
static void switch_context(Context& from, Context& to) {
#if defined(__x86_64__)
  kjit_sm90_emulation_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

/// Prepares `c` to run `entry` (which never returns) on `stack` of `bytes`.
static void make_context(Context& c, char* stack, std::size_t bytes, void (*entry)()) {
#if defined(__x86_64__)
  // The first switch pops six zero registers and returns into entry with the stack as after a
  // call (16-byte aligned plus the return address slot, here a null one).
  auto top = (reinterpret_cast<std::uintptr_t>(stack) + bytes) & ~std::uintptr_t(15);
  auto* slots = reinterpret_cast<void**>(top) - 8;
  for (int i = 0; i < 6; ++i) slots[i] = nullptr;
  slots[6] = reinterpret_cast<void*>(entry);
  slots[7] = nullptr;
  c.sp = slots;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
#endif
}

/// One 16-byte cp.async copy; `valid` false writes zeros.
struct Copy {
  void* dst;
  const void* src;
  bool valid;
};

/// What the emulation's TMA boxes read from a kjit::TensorMap: the test encodes the same request
/// the runtime would hand the driver (encode_tensor_map) into the map's 128 bytes, in this form.
struct EmulatedTensorMap {
  const void* base;
  std::uint64_t dims[3];
  std::uint64_t strides[2];  // bytes of dimensions 1 and 2
  std::uint32_t box[3];
  std::uint32_t element_bytes;
  std::int32_t swizzle_bytes;
  std::int32_t rank;
};
static_assert(sizeof(EmulatedTensorMap) <= sizeof(kjit::TensorMap));

/// A TMA store of a box: the map, the box's coordinates, its shared-memory source.
struct BulkStore {
  EmulatedTensorMap map;
  long long c[3];
  const unsigned char* src;
};

/// The request's map for the emulated TMA (rank 3 only; dimension 0 contiguous).
inline void encode_tensor_map(kjit::TensorMap& map, const void* base, int rank,
                              const std::uint64_t* dims, const std::uint64_t* strides,
                              const std::uint32_t* box, std::uint32_t element_bytes,
                              int swizzle_bytes) {
  EmulatedTensorMap m{};
  m.base = base;
  m.rank = rank;
  for (int i = 0; i < 3 && i < rank; ++i) {
    m.dims[i] = dims[i];
    m.box[i] = box[i];
  }
  for (int i = 0; i < 2 && i + 1 < rank; ++i) m.strides[i] = strides[i];
  m.element_bytes = element_bytes;
  m.swizzle_bytes = swizzle_bytes;
  map = kjit::TensorMap{};
  std::memcpy(&map, &m, sizeof m);
}

inline EmulatedTensorMap decode_tensor_map(const kjit::TensorMap& map) {
  EmulatedTensorMap m;
  std::memcpy(&m, &map, sizeof m);
  return m;
}

/// Where byte `offset` of a box (its rows one after another) sits in shared memory under the
/// map's swizzle: bits 4.. of the offset (the 16-byte piece) XORed with its 128-byte line's
/// index modulo swizzle / 16 (128 bytes: a piece with the row of 8; 32 bytes: the half of a
/// 32-byte row with bit 2 of the row).
inline std::uint32_t swizzled(std::uint32_t offset, const EmulatedTensorMap& m) {
  if (m.swizzle_bytes == 0) return offset;
  const std::uint32_t mask = std::uint32_t(m.swizzle_bytes) / 16 - 1;
  return offset ^ (((offset >> 7) & mask) << 4);
}

/// The shared-memory alignment of a box under the map's swizzle (the pattern's period).
inline std::uint32_t box_alignment(const EmulatedTensorMap& m) {
  return m.swizzle_bytes == 0 ? 128u : 8u * std::uint32_t(m.swizzle_bytes);
}

/// Element (i0, i1, i2) of the map's tensor in global memory, or null outside the tensor.
inline unsigned char* tensor_element(const EmulatedTensorMap& m, long long i0, long long i1,
                                     long long i2) {
  using i64 = long long;
  if (i0 < 0 || i0 >= i64(m.dims[0]) || i1 < 0 || i1 >= i64(m.dims[1]) || i2 < 0 ||
      i2 >= i64(m.dims[2])) {
    return nullptr;
  }
  return static_cast<unsigned char*>(const_cast<void*>(m.base)) + i2 * i64(m.strides[1]) +
         i1 * i64(m.strides[0]) + i0 * i64(m.element_bytes);
}

/// A warpgroup product issued and not yet retired: the thread's accumulators, its warp's A
/// fragments (register A) or A's descriptor (shared A), B's descriptor.
struct Product {
  float* d;
  float* d_hi;  // columns 64.. when not null (mma_m64n128k16_ss's second accumulator)
  int n;        // N of the product: 32, 64 or 128
  bool a_shared;
  u32 a_regs[32][4];
  u64 a_desc, b_desc;
  int trans_b;
};

/// An asynchronous event the scheduler completes at a random later step: copies landing, then
/// an arrival on `bar` (when not null).
struct AsyncArrival {
  std::vector<Copy> copies;
  u64* bar;
  const void* issuer;  // the issuing thread's synchronization address
  /// > 0: a TMA box, which completes this many bytes on `bar` when it lands (no arrival).
  long long tx_bytes = 0;
};

/// What a thread index keeps from one block of a launch to the next: its fiber (stack, saved
/// context, sanitizer state), which runs the kernel once per block in a loop (fiber_entry), so
/// that a launch of thousands of blocks (the chunk kernel's grid) creates its fibers once.
struct Slot {
  std::unique_ptr<char[]> stack;
  Context context;
  bool started = false;
#if defined(KJIT_EMU_ASAN)
  void* fake_stack = nullptr;
#endif
#if defined(KJIT_EMU_TSAN)
  void* tsan_fiber = nullptr;
  int ignore_depth = 0;
#endif
};
constexpr std::size_t kStackBytes = std::size_t(1) << 19;

/// One thread of the block being run.
struct Fiber {
  Slot* slot = nullptr;
  unsigned tid = 0;
  bool done = false;
  // While blocked: the condition to run again, checked when the object it waits on is notified
  // (Block::waiters), and what it waits for (deadlock reports).
  bool blocked = false;
  std::function<bool()> ready;
  const char* wait_kind = "";
  long long wait_detail = 0;
  // cp.async: copies of the open group and of the committed groups, oldest first.
  std::vector<Copy> open_copies;
  std::vector<std::vector<Copy>> copy_groups;
  // wgmma: products of the open group and of the committed groups, oldest first.
  std::vector<Product> open_products;
  std::vector<std::vector<Product>> product_groups;
  // TMA stores (cp.async.bulk.tensor, bulk groups): of the open group and of the committed
  // groups, oldest first; each reads its shared tile only when a wait retires its group.
  std::vector<BulkStore> open_stores;
  std::vector<std::vector<BulkStore>> store_groups;
};

/// The 32 lanes of one warp meeting for a collective operation: each puts up to 32 bytes in, and
/// once all have, each reads everyone's from the generation's snapshot (kept until the
/// generation after next completes, which needs this lane again).
struct Rendezvous {
  using Lanes = std::array<std::array<unsigned char, 32>, 32>;
  unsigned arrived = 0;
  u64 generation = 0;
  Lanes in{};
  Lanes snapshot[2]{};
};

struct NamedBarrier {
  int expected = 0, arrived = 0;
  u64 generation = 0;
};

struct MBarrier {
  bool initialized = false;
  int expected = 0, pending = 0;
  long long tx = 0;
  u32 phase = 0;
};

struct Block {
  unsigned threads = 0;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
  std::vector<Fiber> fibers;
  // The fibers neither done nor blocked (by tid), and where each sits in it (-1: not there).
  std::vector<unsigned> runnable;
  std::vector<int> runnable_at;
  // The blocked fibers by the object they wait on (a rendezvous, a named barrier, an mbarrier):
  // only a change of that object can make them ready, so only its notify checks them.
  std::unordered_map<const void*, std::vector<unsigned>> waiters;
  Context scheduler;
  Fiber* current = nullptr;
  std::mt19937_64 rng;
  std::vector<Rendezvous> warps;
  NamedBarrier named[16];
  std::map<const void*, MBarrier> mbarriers;
  std::vector<AsyncArrival> in_flight;
  std::string failure;
  // How the next fiber is drawn (see pick_next): uniformly among the runnable ones, or the one of
  // the warp with the highest priority, the warps' priorities drawn anew every `reshuffle` steps.
  bool by_priority = false;
  u64 reshuffle = 0;
  std::vector<u32> warp_priority;
  // Statistics (the test prints them: a run that never switched proves nothing).
  u64 switches = 0, landings_late = 0;
#if defined(KJIT_EMU_TSAN)
  void* tsan_scheduler = nullptr;
  int scheduler_ignore_depth = 0;
#endif
  // (TSan) The launching thread's writes happen before every fiber's start (released on
  // start_edge); every fiber's work before the launching thread reads the results (end_edge).
  char start_edge = 0, end_edge = 0;
#if defined(KJIT_EMU_ASAN)
  void* scheduler_fake_stack = nullptr;
#endif
};

static Block* block = nullptr;
static void (*fiber_body)() = nullptr;
#if defined(KJIT_EMU_ASAN)
// The launching thread's stack, which the fibers switch back to.
static const void* scheduler_stack_bottom = nullptr;
static std::size_t scheduler_stack_size = 0;
#endif

// ThreadSanitizer (the tests' TSan tree builds this test): every fiber is a TSan fiber, switched
// to without synchronization, so that TSan reports the races between the emulated threads'
// accesses to shared and global memory that no barrier, mbarrier or __syncwarp orders. The
// emulation's own bookkeeping (its queues, counters, snapshots, threadIdx) is hidden from it
// (Bookkeeping, around every emulated instruction), except the memory accesses those
// instructions make for the kernel (KernelAccess: a copy landing, a poisoned destination,
// ldmatrix's and wgmma's shared operands). Synchronization is annotated where the hardware
// orders memory: named barriers and __syncthreads, __syncwarp, mbarrier arrive -> wait, a
// thread's cp.async -> their landing. Shuffles and the warp-collective products order nothing.
#if defined(KJIT_EMU_TSAN)
static std::atomic<int*> ignore_depth{nullptr};  // the running context's nesting
struct Bookkeeping {
  Bookkeeping() {
    if ((*ignore_depth.load(std::memory_order_relaxed))++ == 0) __tsan_ignore_thread_begin();
  }
  ~Bookkeeping() {
    if (--(*ignore_depth.load(std::memory_order_relaxed)) == 0) __tsan_ignore_thread_end();
  }
  Bookkeeping(const Bookkeeping&) = delete;
  Bookkeeping& operator=(const Bookkeeping&) = delete;
};
struct KernelAccess {
  int saved;
  KernelAccess() : saved(*ignore_depth.load(std::memory_order_relaxed)) {
    if (saved > 0) __tsan_ignore_thread_end();
    *ignore_depth.load(std::memory_order_relaxed) = 0;
  }
  ~KernelAccess() {
    *ignore_depth.load(std::memory_order_relaxed) = saved;
    if (saved > 0) __tsan_ignore_thread_begin();
  }
  KernelAccess(const KernelAccess&) = delete;
  KernelAccess& operator=(const KernelAccess&) = delete;
};
static void release(const void* sync) { __tsan_release(const_cast<void*>(sync)); }
static void acquire(const void* sync) { __tsan_acquire(const_cast<void*>(sync)); }
#else
struct Bookkeeping {
  Bookkeeping() {}  // (a user-provided constructor: no unused-variable warning at its uses)
};
struct KernelAccess {
  KernelAccess() {}
};
static void release(const void*) {}
static void acquire(const void*) {}
#endif

[[noreturn]] static void fail(const std::string& what);

/// Switches from the running fiber back to the scheduler.
static void to_scheduler() {
  Fiber* f = block->current;
  Slot& slot = *f->slot;
#if defined(KJIT_EMU_ASAN)
  __sanitizer_start_switch_fiber(&slot.fake_stack, scheduler_stack_bottom, scheduler_stack_size);
#endif
  Context& scheduler = block->scheduler;
#if defined(KJIT_EMU_TSAN)
  __tsan_switch_to_fiber(block->tsan_scheduler, __tsan_switch_to_fiber_no_sync);
#endif
  switch_context(slot.context, scheduler);
#if defined(KJIT_EMU_ASAN)
  __sanitizer_finish_switch_fiber(slot.fake_stack, nullptr, nullptr);
#endif
#if defined(KJIT_EMU_TSAN)
  ignore_depth.store(&slot.ignore_depth, std::memory_order_relaxed);
#endif
  threadIdx.x = f->tid;
}

static void make_runnable(unsigned t) {
  block->runnable_at[t] = int(block->runnable.size());
  block->runnable.push_back(t);
}
static void remove_runnable(unsigned t) {
  const int at = block->runnable_at[t];
  if (at < 0) return;
  const unsigned last = block->runnable.back();
  block->runnable[std::size_t(at)] = last;
  block->runnable_at[last] = at;
  block->runnable.pop_back();
  block->runnable_at[t] = -1;
}

/// Waits (as the running fiber) until `condition` holds, which only a change of the object at
/// `key` can bring about (its owner calls notify(key) after each); `kind` and `detail` name it
/// for deadlock reports.
static void wait_until(const void* key, std::function<bool()> condition, const char* kind,
                       long long detail) {
  if (condition()) return;
  Fiber* f = block->current;
  f->ready = std::move(condition);
  f->blocked = true;
  f->wait_kind = kind;
  f->wait_detail = detail;
  remove_runnable(f->tid);
  block->waiters[key].push_back(f->tid);
  to_scheduler();
  f->ready = nullptr;
}

/// Makes runnable the fibers waiting on `key` whose condition now holds.
static void notify(const void* key) {
  const auto it = block->waiters.find(key);
  if (it == block->waiters.end()) return;
  std::vector<unsigned>& list = it->second;
  std::size_t kept = 0;
  for (unsigned t : list) {
    Fiber& f = block->fibers[t];
    if (f.ready()) {
      f.blocked = false;
      make_runnable(t);
    } else {
      list[kept++] = t;
    }
  }
  list.resize(kept);
}

/// A preemption point: the scheduler may run another fiber here (one time in three).
static void maybe_yield() {
  if ((block->rng() % 3) != 0) return;
  to_scheduler();
}

[[noreturn]] static void fail(const std::string& what) {
  if (block->failure.empty()) {
    block->failure = "thread " + std::to_string(block->current->tid) + ": " + what;
  }
  block->current->done = true;
  remove_runnable(block->current->tid);
#if defined(KJIT_EMU_TSAN)
  // Never resumed: close the ignores the emulated instruction that failed had opened.
  for (int& depth = *ignore_depth.load(std::memory_order_relaxed); depth > 0; --depth) {
    __tsan_ignore_thread_end();
  }
#endif
  to_scheduler();
  std::abort();  // never resumed
}

static unsigned tid() { return block->current->tid; }

/// A pointer into the block's shared memory from a shared-state-space address.
static unsigned char* shared_at(u32 address, u32 bytes) {
  if (std::size_t(address) + bytes > block->smem_bytes) {
    fail("shared address " + std::to_string(address) + " + " + std::to_string(bytes) +
         " past the block's " + std::to_string(block->smem_bytes) + " bytes");
  }
  return block->smem + address;
}

/// All-gather over the running thread's warp: returns the 32 lanes' `bytes` bytes.
static const std::array<unsigned char, 32>* gather_warp(const void* mine, std::size_t bytes,
                                                        const char* what) {
  Rendezvous& r = block->warps[tid() / 32];
  const unsigned lane = tid() % 32;
  std::memcpy(r.in[lane].data(), mine, bytes);
  const u64 generation = r.generation;
  if (++r.arrived == 32) {
    r.snapshot[generation & 1] = r.in;
    r.arrived = 0;
    ++r.generation;
    notify(&r);
  } else {
    wait_until(
        &r, [&r, generation] { return r.generation != generation; }, what, tid() / 32);
  }
  return r.snapshot[generation & 1].data();
}

template <typename T>
static T lane_value(const std::array<unsigned char, 32>* all, unsigned lane) {
  T v;
  std::memcpy(&v, all[lane].data(), sizeof(T));
  return v;
}

/// ldmatrix / stmatrix .x4: the row addresses the warp's 32 lanes give (`addr`, this lane's;
/// lanes 8 i .. 8 i + 7 those of 8 x 8 matrix i), each 16-byte aligned, or the GPU faults
/// (misaligned address) and the emulation fails the launch; and this lane's place in a fragment
/// (row lane / 4, columns c0 and c0 + 1).
struct WarpMatrices {
  u32 rows[32];
  unsigned row = 0, c0 = 0;
  WarpMatrices(u32 addr, const char* what) {
    const auto* all = gather_warp(&addr, 4, what);
    for (unsigned l = 0; l < 32; ++l) {
      rows[l] = lane_value<u32>(all, l);
      if (rows[l] % 16 != 0) {
        fail(std::string(what) + ": lane " + std::to_string(l) + "'s row address " +
             std::to_string(rows[l]) + " is not 16-byte aligned");
      }
    }
    const unsigned lane = tid() % 32;
    row = lane / 4;
    c0 = 2 * (lane % 4);
  }
  /// The 16-bit element (r, c) of matrix i in shared memory.
  unsigned char* at(unsigned i, unsigned r, unsigned c) const {
    return shared_at(rows[8 * i + r] + 2 * c, 2);
  }
};

static void land(const std::vector<Copy>& copies) {
  const KernelAccess access;
  for (const Copy& c : copies) {
    if (c.valid) {
      std::memcpy(c.dst, c.src, 16);
    } else {
      std::memset(c.dst, 0, 16);
    }
  }
}

static void mbarrier_arrive(u64* bar, int count, long long tx_added);

/// Completes in-flight event `i` (copies land, then its arrival).
static void complete_in_flight(std::size_t i) {
  AsyncArrival event = std::move(block->in_flight[i]);
  block->in_flight.erase(block->in_flight.begin() + static_cast<std::ptrdiff_t>(i));
  acquire(event.issuer);  // the copies follow what their thread did before it issued them
  land(event.copies);
  if (event.bar != nullptr) mbarrier_arrive(event.bar, event.tx_bytes > 0 ? 0 : 1, -event.tx_bytes);
}

// --- mbarriers -------------------------------------------------------------------------------

static MBarrier& mbarrier_of(const u64* bar, const char* op) {
  const auto* p = reinterpret_cast<const unsigned char*>(bar);
  if (p < block->smem || p + 8 > block->smem + block->smem_bytes || (p - block->smem) % 8 != 0) {
    fail(std::string("mbarrier ") + op + " on an address that is no 8-byte aligned shared word");
  }
  MBarrier& m = block->mbarriers[bar];
  if (!m.initialized) fail(std::string("mbarrier ") + op + " on an uninitialized barrier");
  return m;
}

static void mbarrier_arrive(u64* bar, int count, long long tx_added) {
  MBarrier& m = mbarrier_of(bar, "arrive");
  release(&m);
  m.tx += tx_added;
  m.pending -= count;
  if (m.pending < 0) fail("mbarrier: more arrivals than its phase expects");
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    m.pending = m.expected;
    notify(&m);
  }
}

// --- the scheduler ---------------------------------------------------------------------------

/// The end of a thread's work in a block: everything it did happens before the launching thread
/// reads the results (end_edge), nothing of the emulation's is read after that release (the
/// next block's setup would race with it), and the switch away uses locals only, with no ignore
/// left open (TSan checks that when the fiber is destroyed). Returns when the thread index runs
/// in the launch's next block.
static void finish_block() {
  Context* from;
  const Context* to;
  void* end_edge;
#if defined(KJIT_EMU_TSAN)
  void* tsan_to;
#endif
#if defined(KJIT_EMU_ASAN)
  void** fake_stack;
#endif
  {
    const Bookkeeping bookkeeping;
    Fiber* f = block->current;
    f->done = true;
    remove_runnable(f->tid);
    from = &f->slot->context;
    to = &block->scheduler;
    end_edge = &block->end_edge;
#if defined(KJIT_EMU_TSAN)
    tsan_to = block->tsan_scheduler;
#endif
#if defined(KJIT_EMU_ASAN)
    fake_stack = &f->slot->fake_stack;
#endif
  }
  release(end_edge);
#if defined(KJIT_EMU_ASAN)
  __sanitizer_start_switch_fiber(fake_stack, scheduler_stack_bottom, scheduler_stack_size);
#endif
#if defined(KJIT_EMU_TSAN)
  __tsan_switch_to_fiber(tsan_to, __tsan_switch_to_fiber_no_sync);
#endif
  switch_context(*from, *const_cast<Context*>(to));
#if defined(KJIT_EMU_ASAN)
  __sanitizer_finish_switch_fiber(*fake_stack, nullptr, nullptr);
#endif
}

/// A thread index's fiber: the kernel once per block of the launch.
static void fiber_entry() {
#if defined(KJIT_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
  for (;;) {
#if defined(KJIT_EMU_TSAN)
    // (The block's setup happened before this fiber resumed, but not before it in TSan's eyes
    // until the acquire: read its addresses unseen.)
    __tsan_ignore_thread_begin();
    Slot* slot = block->current->slot;
    void* start_edge = &block->start_edge;
    ignore_depth.store(&slot->ignore_depth, std::memory_order_relaxed);
    __tsan_ignore_thread_end();
    acquire(start_edge);
#endif
    fiber_body();
    if (!block->current->open_stores.empty() || !block->current->store_groups.empty()) {
      const Bookkeeping bookkeeping;
      fail(
          "the thread ended with TMA stores it did not wait for (cp.async.bulk.wait_group): "
          "their shared source may be gone before they read it");
    }
    finish_block();
  }
}

/// The next fiber to run among `runnable`. Uniform draws keep every warp at about the same pace,
/// which hides races whose window needs one warpgroup far ahead of another; so half the blocks
/// (by seed) run the highest-priority warp until it blocks, with the warps' priorities drawn anew
/// every few thousand steps (as in probabilistic concurrency testing): one role then runs ahead
/// of the others by whole chunks, another time behind.
static unsigned pick_next(const std::vector<unsigned>& runnable) {
  Block& b = *block;
  if (!b.by_priority) return runnable[b.rng() % runnable.size()];
  if (b.switches % b.reshuffle == 0) {
    for (u32& p : b.warp_priority) p = u32(b.rng());
  }
  unsigned best = runnable.front();
  for (unsigned t : runnable) {
    if (b.warp_priority[t / 32] > b.warp_priority[best / 32]) best = t;
  }
  return best;
}

/// Runs the block's fibers to completion; returns false with block->failure set on a deadlock
/// or a failed check.
static bool run_block() {
#if defined(KJIT_EMU_TSAN)
  block->tsan_scheduler = __tsan_get_current_fiber();
  ignore_depth.store(&block->scheduler_ignore_depth, std::memory_order_relaxed);
  release(&block->start_edge);
#endif
  const Bookkeeping bookkeeping;
  for (;;) {
    if (!block->failure.empty()) return false;
    // An asynchronous completion at a random step: one chance in eight per step.
    if (!block->in_flight.empty() && block->rng() % 8 == 0) {
      complete_in_flight(block->rng() % block->in_flight.size());
      ++block->landings_late;
      continue;
    }
    if (block->runnable.empty()) {
      if (!block->in_flight.empty()) {
        complete_in_flight(block->rng() % block->in_flight.size());
        continue;
      }
      std::map<std::string, std::vector<unsigned>> waits;
      for (Fiber& f : block->fibers) {
        if (!f.done) {
          waits[std::string(f.wait_kind) + " " + std::to_string(f.wait_detail)].push_back(f.tid);
        }
      }
      if (waits.empty()) break;  // every thread is done
      std::string report = "deadlock: no thread can run and nothing is in flight;";
      for (const auto& [what, tids] : waits) {
        report += " " + std::to_string(tids.size()) + " thread(s) from " +
                  std::to_string(tids.front()) + " wait for " + what + ";";
      }
      block->failure = report;
      return false;
    }
    Fiber& f = block->fibers[pick_next(block->runnable)];
    Slot& slot = *f.slot;
    block->current = &f;
    threadIdx.x = f.tid;
    ++block->switches;
    if (!slot.started) {
      slot.started = true;
#if defined(KJIT_EMU_TSAN)
      slot.tsan_fiber = __tsan_create_fiber(0);
#endif
      slot.stack.reset(new char[kStackBytes]);
      make_context(slot.context, slot.stack.get(), kStackBytes, fiber_entry);
    }
    // (Everything the switch needs is read before TSan's switch: after it, reads count as the
    // fiber's.)
    Context& scheduler = block->scheduler;
#if defined(KJIT_EMU_ASAN)
    __sanitizer_start_switch_fiber(&block->scheduler_fake_stack, slot.stack.get(), kStackBytes);
#endif
#if defined(KJIT_EMU_TSAN)
    __tsan_switch_to_fiber(slot.tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
    switch_context(scheduler, slot.context);
#if defined(KJIT_EMU_ASAN)
    __sanitizer_finish_switch_fiber(block->scheduler_fake_stack, nullptr, nullptr);
#endif
#if defined(KJIT_EMU_TSAN)
    ignore_depth.store(&block->scheduler_ignore_depth, std::memory_order_relaxed);
#endif
  }
  // Copies nobody waited for (a sequence's last prefetch) still land.
  while (!block->in_flight.empty()) complete_in_flight(0);
  acquire(&block->end_edge);
  return block->failure.empty();
}

/// What one launch's emulation saw.
struct LaunchReport {
  bool ok = true;
  std::string failure;
  u64 switches = 0, landings_late = 0;
};

/// Runs `kernel(params)` on grid.x * grid.y * grid.z blocks of `threads` threads, one block after
/// another, with `smem` (`smem_bytes`, 1024-byte aligned: the kernel's `extern __shared__`
/// array) as each block's shared memory, poisoned with 0xFF bytes before each block. `seed`
/// draws the interleavings.
template <typename Params>
LaunchReport launch(void (*kernel)(Params), EmulatedDim3 grid, unsigned threads,
                    unsigned char* smem, std::size_t smem_bytes, const Params& params, u64 seed) {
  static const Params* launch_params = nullptr;
  static void (*launch_kernel)(Params) = nullptr;
  launch_params = &params;
  launch_kernel = kernel;
  fiber_body = [] { launch_kernel(*launch_params); };
  LaunchReport report;
  // The thread indices' fibers, created by the first block that runs them.
  std::vector<Slot> slots(threads);
  gridDim = grid;
  blockDim = EmulatedDim3{threads, 1, 1};
  u64 block_seed = seed;
  for (unsigned bz = 0; bz < grid.z && report.ok; ++bz) {
    for (unsigned by = 0; by < grid.y && report.ok; ++by) {
      for (unsigned bx = 0; bx < grid.x && report.ok; ++bx) {
        Block b;
        b.threads = threads;
        b.smem = smem;
        b.smem_bytes = smem_bytes;
        std::memset(smem, 0xFF, smem_bytes);
        b.rng.seed(block_seed++);
        b.by_priority = b.rng() % 2 == 1;
        b.reshuffle = 1000 + b.rng() % 20000;
        b.warp_priority.assign((threads + 31) / 32, 0);
        b.fibers.resize(threads);
        b.runnable_at.assign(threads, -1);
        for (unsigned t = 0; t < threads; ++t) {
          b.fibers[t].tid = t;
          b.fibers[t].slot = &slots[t];
          block = &b;
          make_runnable(t);
        }
        b.warps.resize((threads + 31) / 32);
        block = &b;
        blockIdx = EmulatedDim3{bx, by, bz};
        report.ok = run_block();
        report.switches += b.switches;
        report.landings_late += b.landings_late;
        if (!report.ok) {
          report.failure = "block (" + std::to_string(bx) + ", " + std::to_string(by) + ", " +
                           std::to_string(bz) + "): " + b.failure;
        }
        block = nullptr;
      }
    }
  }
  // Every fiber is suspended at the end of a block (or where a check failed): dropped with its
  // stack, not unwound.
#if defined(KJIT_EMU_TSAN)
  for (Slot& slot : slots) {
    if (slot.tsan_fiber != nullptr) __tsan_destroy_fiber(slot.tsan_fiber);
  }
#endif
  return report;
}

// --- element access of shared-memory tiles ---------------------------------------------------

static float bf16_bits_to_float(unsigned short bits) { return __uint_as_float(u32(bits) << 16); }

/// A wgmma operand behind a shared-memory matrix descriptor, for an operand whose contiguous
/// dimension is `col` ("K-major" for A and for B with trans 0: row = M or N, col = K; B with
/// trans 1, "N-major": row = K, col = N). templates/common/wgmma.cuh documents the layouts this
/// reads (checked on the H200 by bench/experiments/wgmma_layout_check.cu).
struct Operand {
  u32 start, lbo, sbo;
  bool swizzled, contiguous_is_k;

  Operand(u64 desc, bool k_contiguous)
      : start(u32(desc & 0x3fffu) << 4),
        lbo(u32((desc >> 16) & 0x3fffu) << 4),
        sbo(u32((desc >> 32) & 0x3fffu) << 4),
        swizzled(false),
        contiguous_is_k(k_contiguous) {
    const int layout = int(desc >> 62);
    if (layout != 0 && layout != 1) {
      fail("wgmma descriptor with a swizzle mode other than none or 128 bytes");
    }
    swizzled = layout == 1;
  }

  /// The byte address of element (row, col).
  u32 address(int row, int col) const {
    const u32 r = u32(row), c = u32(col);
    if (!swizzled) {  // core matrices of 8 rows x 16 bytes; lbo steps along K, sbo along M/N
      return contiguous_is_k ? start + (c / 8) * lbo + (r / 8) * sbo + (r % 8) * 16 + (c % 8) * 2
                             : start + (r / 8) * lbo + (c / 8) * sbo + (r % 8) * 16 + (c % 8) * 2;
    }
    // Rows of 128 bytes: along K (K-major; sbo between 8-row groups), or along N, 64 columns
    // each (N-major; lbo between 64-column atoms, sbo between 8-row groups along K); chunk bits
    // 4..6 of the address XOR its row bits 7..9.
    const u32 a = contiguous_is_k
                      ? start + (r / 8) * sbo + (r % 8) * 128 + c * 2
                      : start + (c / 64) * lbo + (r / 8) * sbo + (r % 8) * 128 + (c % 64) * 2;
    return a ^ (((a >> 7) & 7u) << 4);
  }

  float at(int row, int col) const {
    unsigned short bits;
    std::memcpy(&bits, shared_at(address(row, col), 2), 2);
    return bf16_bits_to_float(bits);
  }
};

/// Element (r, k) (r 0..15, k 0..15) of a warp's mma.sync / wgmma A fragment held as lanes'
/// registers a[lane][0..3] (mma.cuh's layout).
static float a_fragment(const u32 (&a)[32][4], int r, int k) {
  const int reg = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
  const int lane = 4 * (r % 8) + (k % 8) / 2;
  const u32 word = a[lane][reg];
  return bf16_bits_to_float(static_cast<unsigned short>((k % 2) ? word >> 16 : word & 0xffffu));
}

/// Retires product `p` for the running thread: its accumulator elements += A B (A's two rows
/// and B's columns of this thread read once each).
static void retire(const Product& p) {
  const KernelAccess access;
  const unsigned t = tid();
  const int warp_in_group = int(t / 32) % 4, lane = int(t % 32), g = lane / 4, t4 = lane % 4;
  float a[2][16];
  for (int hf = 0; hf < 2; ++hf) {
    for (int k = 0; k < 16; ++k) {
      a[hf][k] = p.a_shared ? Operand(p.a_desc, true).at(16 * warp_in_group + g + 8 * hf, k)
                            : a_fragment(p.a_regs, g + 8 * hf, k);
    }
  }
  const Operand b_tile(p.b_desc, p.trans_b == 0);
  for (int nt = 0; nt < p.n / 8; ++nt) {
    for (int c = 0; c < 2; ++c) {
      const int col = 8 * nt + 2 * t4 + c;
      float b[16];
      for (int k = 0; k < 16; ++k) {
        b[k] = p.trans_b ? b_tile.at(k, col) : b_tile.at(col, k);
      }
      for (int hf = 0; hf < 2; ++hf) {
        float sum = 0.f;
        for (int k = 0; k < 16; ++k) sum += a[hf][k] * b[k];
        float* const d = p.d_hi != nullptr && nt >= 8 ? p.d_hi + (nt - 8) * 4 : p.d + nt * 4;
        d[2 * hf + c] += sum;
      }
    }
  }
}

}  // namespace kjit_sm90_emulation

// --- intrinsics: thread identity and warp collectives ----------------------------------------

static inline unsigned __cvta_generic_to_shared(const void* p) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < emu::block->smem || c > emu::block->smem + emu::block->smem_bytes) {
    emu::fail("__cvta_generic_to_shared of a pointer outside shared memory");
  }
  return static_cast<unsigned>(c - emu::block->smem);
}

[[noreturn]] static inline void __trap() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::fail("__trap");
}

/// __syncwarp orders the warp's memory accesses (a shuffle does not).
static inline void __syncwarp(unsigned = 0xffffffffu) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const emu::Rendezvous& warp = emu::block->warps[emu::tid() / 32];
  emu::release(&warp);
  const int none = 0;
  emu::gather_warp(&none, 0, "__syncwarp");
  emu::acquire(&warp);
}

template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int mask) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const auto* all = emu::gather_warp(&v, sizeof(T), "shuffle");
  return emu::lane_value<T>(all, (emu::tid() % 32) ^ unsigned(mask));
}
template <typename T>
static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const auto* all = emu::gather_warp(&v, sizeof(T), "shuffle");
  const unsigned lane = emu::tid() % 32, w = unsigned(width);
  return emu::lane_value<T>(all, lane / w * w + unsigned(src) % w);
}
template <typename T>
static inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const auto* all = emu::gather_warp(&v, sizeof(T), "shuffle");
  const unsigned lane = emu::tid() % 32, w = unsigned(width);
  return (lane % w) >= delta ? emu::lane_value<T>(all, lane - delta) : v;
}
static inline unsigned __ballot_sync(unsigned, int predicate) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const int mine = predicate != 0;
  const auto* all = emu::gather_warp(&mine, sizeof(int), "ballot");
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= (emu::lane_value<int>(all, l) != 0 ? 1u : 0u) << l;
  return bits;
}

namespace kjit_sm90_emulation {
/// bar.sync / bar.arrive on barrier `id` for `count` threads.
static void named_barrier_op(int id, int count, bool wait) {
  if (id < 0 || id >= 16) fail("named barrier id " + std::to_string(id) + " outside 0..15");
  NamedBarrier& b = block->named[id];
  if (b.arrived == 0) {
    b.expected = count;
  } else if (b.expected != count) {
    fail("named barrier " + std::to_string(id) + ": an arrival for " + std::to_string(count) +
         " threads in a phase for " + std::to_string(b.expected));
  }
  const u64 generation = b.generation;
  release(&b);
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    notify(&b);
    if (wait) acquire(&b);
    return;
  }
  if (wait) {
    wait_until(
        &b, [&b, generation] { return b.generation != generation; }, "named barrier", id);
    acquire(&b);
  } else {
    maybe_yield();
  }
}
}  // namespace kjit_sm90_emulation

static inline void __syncthreads() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::named_barrier_op(0, int(blockDim.x), true);
}

// --- the guarded primitives of templates/common and templates/gdn_prefill --------------------

namespace kjit {

namespace named_barrier {
template <int kThreads>
static inline void sync(int id) {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::named_barrier_op(id, kThreads, true);
}
template <int kId, int kThreads>
static inline void sync() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::named_barrier_op(kId, kThreads, true);
}
template <int kId>
static inline void sync_count(u32 threads) {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::named_barrier_op(kId, int(threads), true);
}
template <int kThreads>
static inline void arrive(int id) {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::named_barrier_op(id, kThreads, false);
}
}  // namespace named_barrier

namespace grid_dependency {
static inline void allow_dependent_launch() {}
static inline void wait_for_previous_grid() {}
}  // namespace grid_dependency

namespace gdn_prefill_detail {
/// ex2.approx.ftz: 2^x, results below 2^-126 flushed to zero.
static inline float ex2(float x) {
  const float y = std::exp2(x);
  return std::fabs(y) < 1.17549435e-38f ? 0.f : y;
}
}  // namespace gdn_prefill_detail

namespace cp_async {
static inline void copy16(void* dst, const void* src, bool valid) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  (void)__cvta_generic_to_shared(dst);
  {
    const emu::KernelAccess access;
    std::memset(dst, 0xFF, 16);  // poison until it lands
  }
  emu::block->current->open_copies.push_back({dst, src, valid});
  emu::maybe_yield();
}
static inline void copy16(void* dst, const void* src) { copy16(dst, src, true); }
static inline void commit() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  auto& f = *kjit_sm90_emulation::block->current;
  f.copy_groups.push_back(std::move(f.open_copies));
  f.open_copies.clear();
}
template <int kPending>
static inline void wait() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  auto& f = *kjit_sm90_emulation::block->current;
  while (f.copy_groups.size() > std::size_t(kPending)) {
    kjit_sm90_emulation::land(f.copy_groups.front());
    f.copy_groups.erase(f.copy_groups.begin());
  }
  kjit_sm90_emulation::maybe_yield();
}
}  // namespace cp_async

namespace mbarrier {
static inline void init(u64* bar, u32 count) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  (void)__cvta_generic_to_shared(bar);
  emu::MBarrier& m = emu::block->mbarriers[bar];
  m = emu::MBarrier{true, int(count), int(count), 0, 0};
}
static inline void fence_init() {}
static inline void arrive(u64* bar) {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::mbarrier_arrive(bar, 1, 0);
  kjit_sm90_emulation::maybe_yield();
}
static inline void arrive_expect_tx(u64* bar, u32 bytes) {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::mbarrier_arrive(bar, 1, bytes);
  kjit_sm90_emulation::maybe_yield();
}
/// The arrival once every cp.async this thread issued so far has landed: both happen at a
/// random later step of the scheduler.
static inline void cp_async_arrive_noinc(u64* bar) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  (void)emu::mbarrier_of(bar, "cp.async arrive");
  emu::Fiber& f = *emu::block->current;
  emu::release(&f);
  emu::AsyncArrival event{{}, bar, &f};
  for (auto& group : f.copy_groups) {
    event.copies.insert(event.copies.end(), group.begin(), group.end());
  }
  event.copies.insert(event.copies.end(), f.open_copies.begin(), f.open_copies.end());
  f.copy_groups.clear();
  f.open_copies.clear();
  emu::block->in_flight.push_back(std::move(event));
  emu::maybe_yield();
}
static inline void wait(u64* bar, u32 parity) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  emu::MBarrier& m = emu::mbarrier_of(bar, "wait");
  emu::wait_until(
      &m, [&m, parity] { return (m.phase & 1u) != (parity & 1u); },
      parity & 1u ? "the mbarrier's parity-1 phase at shared byte"
                  : "the mbarrier's parity-0 phase at shared byte",
      __cvta_generic_to_shared(bar));
  emu::acquire(&m);
  emu::maybe_yield();
}
static inline u64 evict_first_policy() { return 0; }
static inline void bulk_load(void* dst, const void* src, u32 bytes, u64* bar, u64) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  (void)emu::mbarrier_of(bar, "bulk copy");
  {
    const emu::KernelAccess access;
    std::memcpy(dst, src, bytes);
  }
  emu::mbarrier_arrive(bar, 0, -static_cast<long long>(bytes));
}
}  // namespace mbarrier

namespace tma {
static inline void prefetch_map(const TensorMap*) {}
/// The map of a 3-dimensional box copy and the box's shared-memory offset, checked: a map of
/// another rank, or a box not aligned as the map's swizzle needs, fails the block (`what` names
/// the copy).
static inline kjit_sm90_emulation::EmulatedTensorMap checked_box(const TensorMap* map,
                                                                 const void* smem_box,
                                                                 const char* what, u32* shared) {
  namespace emu = kjit_sm90_emulation;
  const emu::EmulatedTensorMap m = emu::decode_tensor_map(*map);
  if (m.rank != 3)
    emu::fail(std::string(what) + ": a 3-dimensional copy through a map of rank " +
              std::to_string(m.rank));
  const auto offset = reinterpret_cast<std::uintptr_t>(smem_box) -
                      reinterpret_cast<std::uintptr_t>(emu::block->smem);
  if (offset % emu::box_alignment(m) != 0) {
    emu::fail(std::string(what) + ": the shared box is not aligned as the map's swizzle needs");
  }
  *shared = static_cast<u32>(offset);
  (void)emu::shared_at(*shared, m.box[0] * m.box[1] * m.box[2] * m.element_bytes);
  return m;
}
/// A box of a map the test encoded (kjit_sm90_emulation::encode_tensor_map): poisoned at once,
/// landing (16-byte pieces, swizzled as the map says, zeros outside the tensor) and completing
/// its bytes on `bar` at a random later step, as cp.async's arrivals do.
static inline void load_3d(void* dst, const TensorMap* map, int c0, int c1, int c2, u64* bar) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  (void)emu::mbarrier_of(bar, "TMA box");
  u32 shared = 0;
  const emu::EmulatedTensorMap m = checked_box(map, dst, "TMA load", &shared);
  const u32 row_bytes = m.box[0] * m.element_bytes;
  if (row_bytes % 16 != 0 || (m.swizzle_bytes != 0 && row_bytes != u32(m.swizzle_bytes))) {
    emu::fail(
        "TMA box: rows the emulation does not lay out (a multiple of 16 bytes, and the "
        "swizzle's span when swizzled)");
  }
  const u32 pieces = row_bytes / 16, rows = m.box[1] * m.box[2];
  const u32 bytes = rows * row_bytes;
  {
    const emu::KernelAccess access;
    std::memset(emu::shared_at(shared, bytes), 0xFF, bytes);  // until it lands
  }
  emu::Fiber& f = *emu::block->current;
  emu::release(&f);
  emu::AsyncArrival event{{}, bar, &f, bytes};
  for (u32 r = 0; r < rows; ++r) {
    using i64 = long long;
    const i64 i1 = c1 + i64(r % m.box[1]), i2 = c2 + i64(r / m.box[1]);
    for (u32 j = 0; j < pieces; ++j) {
      // A 16-byte piece lands whole when its first and last elements are inside the tensor.
      const i64 i0 = c0 + i64(j * 16 / m.element_bytes);
      const unsigned char* from = emu::tensor_element(m, i0, i1, i2);
      const bool inside =
          from != nullptr && emu::tensor_element(m, i0 + 16 / m.element_bytes - 1, i1, i2);
      void* to = static_cast<unsigned char*>(dst) + emu::swizzled(r * row_bytes + j * 16, m);
      event.copies.push_back({to, inside ? from : m.base, inside});
    }
  }
  emu::block->in_flight.push_back(std::move(event));
  emu::maybe_yield();
}
/// A box out to global memory: recorded in the thread's open bulk group; it reads its tile and
/// writes (the elements inside the tensor) when a wait retires its group.
static inline void store_3d(const TensorMap* map, int c0, int c1, int c2, const void* src) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  u32 shared = 0;
  const emu::EmulatedTensorMap m = checked_box(map, src, "TMA store", &shared);
  emu::block->current->open_stores.push_back(
      {m, {c0, c1, c2}, static_cast<const unsigned char*>(src)});
  emu::maybe_yield();
}
static inline void commit_group() {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  emu::Fiber& f = *emu::block->current;
  f.store_groups.push_back(std::move(f.open_stores));
  f.open_stores.clear();
}
/// Retires this thread's oldest store groups until kPending are left: each reads its tile now.
template <int kPending>
static inline void wait_group() {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  emu::Fiber& f = *emu::block->current;
  while (f.store_groups.size() > std::size_t(kPending)) {
    const emu::KernelAccess access;
    for (const emu::BulkStore& st : f.store_groups.front()) {
      const emu::EmulatedTensorMap& m = st.map;
      const u32 row_bytes = m.box[0] * m.element_bytes;
      for (u32 r = 0; r < m.box[1] * m.box[2]; ++r) {
        for (u32 e = 0; e < m.box[0]; ++e) {
          // (Elements outside the tensor are not written.)
          if (unsigned char* to = emu::tensor_element(m, st.c[0] + e, st.c[1] + r % m.box[1],
                                                      st.c[2] + r / m.box[1])) {
            std::memcpy(to, st.src + emu::swizzled(r * row_bytes + e * m.element_bytes, m),
                        m.element_bytes);
          }
        }
      }
    }
    f.store_groups.erase(f.store_groups.begin());
  }
  emu::maybe_yield();
}
/// (The emulation's stores read their tiles only at a wait: .read waits the same.)
template <int kPending>
static inline void wait_group_read() {
  wait_group<kPending>();
}
}  // namespace tma

namespace mma {
static inline u32 transpose8x8(u32 x) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const auto* all = emu::gather_warp(&x, 4, "movmatrix");
  const unsigned lane = emu::tid() % 32, r = lane / 4, c0 = 2 * (lane % 4);
  // Element (row, col) of the input: half col % 2 of lane 4 row + col / 2.
  const auto at = [&](unsigned row, unsigned col) -> u32 {
    const u32 w = emu::lane_value<u32>(all, 4 * row + col / 2);
    return (col % 2) ? w >> 16 : w & 0xffffu;
  };
  return at(c0, r) | (at(c0 + 1, r) << 16);
}

/// One warp's m16n8kK mma (K = 16: two 16-bit elements per register; K = 8: one tf32 per
/// register), f32 accumulate, over the gathered (a[4], b0, b1) of the 32 lanes. A (r, k) and
/// B (k, n) sit where the PTX fragment layouts put them; element(word, k) decodes element k's
/// value from its 32-bit register.
template <int kK, typename Element>
static inline void emulated_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, const char* what,
                                Element&& element) {
  static_assert(kK == 16 || kK == 8, "m16n8k16 (16-bit operands) or m16n8k8 (tf32)");
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const u32 mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  const auto* all = emu::gather_warp(mine, sizeof(mine), what);
  const auto word = [&](unsigned l, int reg) {
    u32 w[6];
    std::memcpy(w, all[l].data(), sizeof(w));
    return w[reg];
  };
  // Per register: kK / 8 k values in a lane, 4 lanes a row of 8 (K = 16) or 4 (K = 8) k values.
  constexpr int kPerLane = kK / 8, kPerRegister = 4 * kPerLane;
  const unsigned lane = emu::tid() % 32, g = lane / 4, t4 = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = int(g) + (e >= 2 ? 8 : 0), n = int(2 * t4) + (e & 1);
    float sum = 0.f;
    for (int k = 0; k < kK; ++k) {
      const unsigned quad_lane = unsigned(k % kPerRegister) / kPerLane;
      const int high = k >= kPerRegister ? 1 : 0;
      const float av =
          element(word(4 * unsigned(r % 8) + quad_lane, (r >= 8 ? 1 : 0) + 2 * high), k);
      const float bv = element(word(4 * unsigned(n) + quad_lane, 4 + high), k);
      sum += av * bv;
    }
    d[e] += sum;
  }
}

/// m16n8k16, bf16 operands: element k in the low (even k) or high (odd k) half of its register.
static inline void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  emulated_mma<16>(d, a, b0, b1, "mma.sync", [](u32 w, int k) {
    return kjit_sm90_emulation::bf16_bits_to_float(
        static_cast<unsigned short>((k % 2) ? w >> 16 : w & 0xffffu));
  });
}

/// m16n8k16, f16 operands (the layout of mma_bf16).
static inline void mma_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  emulated_mma<16>(d, a, b0, b1, "mma.sync f16", [](u32 w, int k) {
    return kjit::support::f16_to_float(
        static_cast<unsigned short>((k % 2) ? w >> 16 : w & 0xffffu));
  });
}

/// m16n8k8, tf32 operands (the low 13 bits of each operand ignored).
static inline void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  emulated_mma<8>(d, a, b0, b1, "mma.sync tf32",
                  [](u32 w, int) { return __uint_as_float(w & 0xffffe000u); });
}

/// ldmatrix .x4 (trans: each 8 x 8 matrix transposed): lanes 8 i .. 8 i + 7 give the row
/// addresses of matrix i; lane l receives matrix i's row l / 4, columns 2 (l % 4) and + 1.
static inline void ldmatrix_x4_impl(u32 (&r)[4], u32 addr, bool trans) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const emu::WarpMatrices m(addr, "ldmatrix");
  const unsigned row = m.row, c0 = m.c0;
  const emu::KernelAccess access;
  for (unsigned i = 0; i < 4; ++i) {
    const auto at = [&](unsigned rr, unsigned cc) -> u32 {
      unsigned short bits;
      std::memcpy(&bits, m.at(i, rr, cc), 2);
      return bits;
    };
    r[i] =
        trans ? (at(c0, row) | (at(c0 + 1, row) << 16)) : (at(row, c0) | (at(row, c0 + 1) << 16));
  }
}
static inline void ldmatrix_x4(u32 (&r)[4], u32 addr) { ldmatrix_x4_impl(r, addr, false); }
static inline void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) { ldmatrix_x4_impl(r, addr, true); }

/// stmatrix .x4 (trans: each 8 x 8 matrix transposed): lanes 8 i .. 8 i + 7 give the row
/// addresses of matrix i; lane l's r[i] holds the fragment's row l / 4, columns 2 (l % 4) and
/// + 1, which land in matrix i's row l / 4 at those columns, or (trans) in rows 2 (l % 4) and
/// + 1 at column l / 4. Each lane writes its own elements.
static inline void stmatrix_x4_impl(u32 addr, const u32 (&r)[4], bool trans) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  const emu::WarpMatrices m(addr, "stmatrix");
  const unsigned row = m.row, c0 = m.c0;
  const emu::KernelAccess access;
  for (unsigned i = 0; i < 4; ++i) {
    for (unsigned h = 0; h < 2; ++h) {
      // Element (row, c0 + h) of the fragment, at (c0 + h, row) of the matrix when transposed.
      const unsigned rr = trans ? c0 + h : row, cc = trans ? row : c0 + h;
      const auto bits = static_cast<unsigned short>(h ? r[i] >> 16 : r[i] & 0xffffu);
      std::memcpy(m.at(i, rr, cc), &bits, 2);
    }
  }
}
static inline void stmatrix_x4(u32 addr, const u32 (&r)[4]) { stmatrix_x4_impl(addr, r, false); }
static inline void stmatrix_x4_trans(u32 addr, const u32 (&r)[4]) {
  stmatrix_x4_impl(addr, r, true);
}
}  // namespace mma

namespace wgmma {
static inline void fence() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::maybe_yield();
}
static inline void fence_shared_writes() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  kjit_sm90_emulation::maybe_yield();
}
static inline void commit() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  auto& f = *kjit_sm90_emulation::block->current;
  f.product_groups.push_back(std::move(f.open_products));
  f.open_products.clear();
  kjit_sm90_emulation::maybe_yield();
}
/// Retires every committed group but the newest kPending: the products read their shared
/// operands now and add into the accumulators.
template <int kPending>
static inline void wait() {
  const kjit_sm90_emulation::Bookkeeping bookkeeping;
  auto& f = *kjit_sm90_emulation::block->current;
  while (f.product_groups.size() > std::size_t(kPending)) {
    for (const auto& p : f.product_groups.front()) kjit_sm90_emulation::retire(p);
    f.product_groups.erase(f.product_groups.begin());
  }
  kjit_sm90_emulation::maybe_yield();
}
template <int N>
static inline void hold_registers(float (&)[N][4]) {}

namespace emulated {
template <int kN>
static inline void issue(float* d, const u32* a_regs, u64 a_desc, u64 b, int trans_b,
                         float* d_hi = nullptr) {
  namespace emu = kjit_sm90_emulation;
  const emu::Bookkeeping bookkeeping;
  emu::Product p{};
  p.d = d;  // kN / 8 n-tiles of 4 (columns 64.. in d_hi when that is given)
  p.d_hi = d_hi;
  p.n = kN;
  p.a_shared = a_regs == nullptr;
  p.a_desc = a_desc;
  p.b_desc = b;
  p.trans_b = trans_b;
  if (a_regs != nullptr) {
    const auto* all = emu::gather_warp(a_regs, 16, "wgmma A fragments");
    for (unsigned l = 0; l < 32; ++l) std::memcpy(p.a_regs[l], all[l].data(), 16);
  }
  emu::block->current->open_products.push_back(p);
  emu::maybe_yield();
}
}  // namespace emulated

template <int kTransB>
static inline void mma_m64n64k16(float (&d)[8][4], const u32 (&a)[4], u64 b) {
  emulated::issue<64>(&d[0][0], a, 0, b, kTransB);
}
template <int kTransB>
static inline void mma_m64n64k16_ss(float (&d)[8][4], u64 a, u64 b) {
  emulated::issue<64>(&d[0][0], nullptr, a, b, kTransB);
}
template <int kTransB>
static inline void mma_m64n32k16_ss(float (&d)[4][4], u64 a, u64 b) {
  emulated::issue<32>(&d[0][0], nullptr, a, b, kTransB);
}
template <int kTransB>
static inline void mma_m64n128k16(float (&d)[16][4], const u32 (&a)[4], u64 b) {
  emulated::issue<128>(&d[0][0], a, 0, b, kTransB);
}
template <int kTransB>
static inline void mma_m64n128k16_ss(float (&d_lo)[8][4], float (&d_hi)[8][4], u64 a, u64 b) {
  emulated::issue<128>(&d_lo[0][0], nullptr, a, b, kTransB, &d_hi[0][0]);
}
template <int kTransB>
static inline void mma_m64n128k16(float (&d_lo)[8][4], float (&d_hi)[8][4], const u32 (&a)[4],
                                  u64 b) {
  emulated::issue<128>(&d_lo[0][0], a, 0, b, kTransB, &d_hi[0][0]);
}
template <int kRegisters>
static inline void release_registers() {}
template <int kRegisters>
static inline void claim_registers() {}
}  // namespace wgmma

}  // namespace kjit
