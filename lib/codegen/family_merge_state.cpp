// SPDX-License-Identifier: Apache-2.0
#include "codegen/family_decls.hpp"

namespace kjit::codegen {

// Parameters in the order of the template arguments of kjit::merge_state_kernel
// (templates/merge_state/merge_state.cuh).
FamilyDecl merge_state_family() {
  return FamilyDecl{
      .name = "merge_state",
      .include = "templates/merge_state/merge_state.cuh",
      .kernel = "kjit::merge_state_kernel",
      .params =
          {
              ParamDecl{.name = "in",
                        .kind = ParamKind::dtype,
                        .choices = {"f16", "bf16", "f32"},
                        .doc = "dtype of the input states"},
              ParamDecl{.name = "out",
                        .kind = ParamKind::dtype,
                        .choices = {"f16", "bf16", "f32"},
                        .doc = "dtype of v_out (the input dtype or f32)"},
              ParamDecl{.name = "head_dim",
                        .kind = ParamKind::integer,
                        .min = 8,
                        .max = 1024,
                        .multiple_of = 8,
                        .doc = "elements per (token, head) row"},
              ParamDecl{.name = "vec",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 8,
                        .doc = "elements per vector access (16 bytes when alignment allows)"},
              ParamDecl{.name = "chunks",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 4,
                        .doc = "vectors of each input row per thread"},
              ParamDecl{
                  .name = "mode",
                  .kind = ParamKind::choice,
                  .choices = {"token_major", "flat"},
                  .rendered = {"kjit::MergeGridMode::token_major", "kjit::MergeGridMode::flat"},
                  .doc = "token_major: grid (T, head groups); flat: rows packed on grid x"},
              ParamDecl{.name = "op",
                        .kind = ParamKind::choice,
                        .choices = {"pair", "in_place", "many"},
                        .rendered = {"kjit::MergeOp::pair", "kjit::MergeOp::in_place",
                                     "kjit::MergeOp::many"},
                        .doc = "merge_state, merge_state_in_place or merge_states"},
              ParamDecl{.name = "base",
                        .kind = ParamKind::choice,
                        .choices = {"2", "e"},
                        .rendered = {"kjit::MergeBase::two", "kjit::MergeBase::e"},
                        .doc = "base of the log-sum-exp values"},
              ParamDecl{.name = "pos_inf_empty",
                        .kind = ParamKind::boolean,
                        .doc = "1: an LSE of +inf marks an empty state"},
          },
      .min_sm = 80,
      .doc = "merge partial attention states (v, lse) of the same rows",
  };
}

}  // namespace kjit::codegen
