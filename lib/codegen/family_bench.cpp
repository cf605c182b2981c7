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

}  // namespace kjit::codegen
