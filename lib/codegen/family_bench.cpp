// SPDX-License-Identifier: Apache-2.0
#include "codegen/family_decls.hpp"

namespace kjit::codegen {

FamilyDecl bench_family() {
  return FamilyDecl{
      .name = "bench",
      .include = "templates/bench/bench.cuh",
      .kernel = "kjit::bench_kernel",
      .params = {ParamDecl{.name = "kernel",
                           .kind = ParamKind::choice,
                           .choices = {"empty", "spin"},
                           .rendered = {"0", "1"},
                           .doc = "empty: the launch floor; spin: busy-waits BenchParams::cycles"}},
      .min_sm = 70,
      .doc = "benchmark helpers: empty kernel and spin kernel",
  };
}

// A family of its own rather than a third `kernel` choice of bench: its shape parameters mean
// nothing to the empty and spin kernels, and the unit tests' family sweep compiles each family's
// first choice at sm_80, sm_90 and sm_100a, which would never reach a third.
FamilyDecl bench_slot_rmw_family() {
  return FamilyDecl{
      .name = "bench_slot_rmw",
      .include = "templates/bench/bench.cuh",
      .kernel = "kjit::bench_slot_rmw_kernel",
      .params = {ParamDecl{.name = "rows",
                           .kind = ParamKind::integer,
                           .min = 1,
                           .max = 16,
                           .doc = "512-byte rows of the slot per warp, all loaded before the "
                                  "first is stored (16 bytes per lane and row)"},
                 ParamDecl{.name = "warps",
                           .kind = ParamKind::integer,
                           .min = 1,
                           .max = 8,
                           .doc = "warps per block; a block moves rows x warps x 512 bytes"},
                 ParamDecl{.name = "hint",
                           .kind = ParamKind::choice,
                           .choices = {"plain", "cs", "l2_256"},
                           .rendered = {"0", "1", "2"},
                           .doc = "pool accesses: default policy; .cs loads and stores; loads "
                                  ".L2::256B with plain stores"}},
      // .L2::256B needs sm_80.
      .min_sm = 80,
      .doc =
          "benchmark floor: reads and writes back selected slots of a pool in place, reads "
          "the inputs and writes the output once, no arithmetic (SlotRmwParams)",
  };
}

}  // namespace kjit::codegen
