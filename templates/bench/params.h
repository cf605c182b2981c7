// SPDX-License-Identifier: Apache-2.0
// Parameter blocks of the benchmark helper kernels (templates/bench/bench.cuh).
#pragma once

#include "templates/common/types.h"

namespace kjit {

struct BenchParams {
  /// Spin kernel: how many SM clock cycles to wait.
  u64 cycles;
};

/// Cache hint of bench_slot_rmw_kernel's pool accesses (template parameter kHint).
enum BenchSlotRmwHint : int {
  /// No hint: the default caching policy.
  kBenchSlotRmwPlain = 0,
  /// .cs loads and stores: streaming, evict first.
  kBenchSlotRmwStream = 1,
  /// Loads .L1::no_allocate.L2::256B (L2 fetches whole 256-byte blocks), plain stores.
  kBenchSlotRmwL2Prefetch = 2,
};

/// bench_slot_rmw_kernel: the bytes of a step on a pool of per-sequence states, and nothing else.
struct SlotRmwParams {
  /// slots[i] is the slot grid row i reads and writes back in place (a negative one: no slot, as
  /// an op's padding rows); each slot is slot_bytes at pool + slot * slot_bytes.
  void* pool;
  const i32* slots;
  u64 slot_bytes;
  /// Blocks per slot: slot_bytes / (rows x warps x 512), the grid is rows of the batch x this.
  u32 tiles_per_slot;
  /// Added to every 32-bit word the kernel stores. 0 when timed: the pool keeps its bytes, and the
  /// stores of what was just loaded stay (the compiler cannot know the value, so it cannot drop
  /// them as stores of unchanged memory). The bench's check adds 1 and then 0xffffffff.
  u32 delta;
  /// Read-only inputs read once each and an output written once (16-byte multiples, 16-byte
  /// aligned): an op's other tensors, so that the kernel moves every byte the step moves.
  const void* inputs[2];
  u64 input_bytes[2];
  void* output;
  u64 output_bytes;
};

}  // namespace kjit
