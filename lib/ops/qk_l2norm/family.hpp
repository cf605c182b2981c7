// SPDX-License-Identifier: Apache-2.0
// qk_l2norm on the op skeleton (ops/op.hpp): the worked example of a family written on it
// (docs/architecture.md, "How to add an op family"). check/plan/params and the entry points
// are in qk_l2norm.cpp; the kernel family and the catalog entries register themselves from
// catalog.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kjit/device.hpp"
#include "kjit/ops/qk_l2norm.hpp"
#include "kjit/types.hpp"
#include "ops/op.hpp"
#include "templates/qk_l2norm/params.h"

namespace kjit::ops::l2norm {

/// The arguments of one call. k and k_out have data == nullptr when only q is normalized.
struct Args {
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* q_out = nullptr;
  const TensorView* k_out = nullptr;
  const QkL2NormOptions* options = nullptr;
};

/// Everything the plan depends on: sizes, dtype, and the alignment the pointers and strides
/// allow (not the pointers, not eps: eps is a kernel argument). The memo key.
struct Problem {
  std::int64_t tokens = 0;
  std::int64_t q_heads = 0;
  /// 0: no k.
  std::int64_t k_heads = 0;
  std::int64_t head_dim = 0;
  /// Largest power of two <= 16 dividing every address and every stepped-over stride, in bytes.
  std::int64_t align = 16;
  DType dtype = DType::bf16;
  /// Keeps the size a multiple of 8 with every byte a member (the memo hashes the bytes).
  std::uint8_t unused[7] = {};
};
static_assert(std::has_unique_object_representations_v<Problem> && sizeof(Problem) % 8 == 0);

/// The planner's decisions the launch needs: elements per access, lanes per row.
struct Choice {
  std::int32_t vec = 1;
  std::int32_t lanes = 32;
};

struct Family {
  static constexpr const char* kName = "qk_l2norm";
  using Problem = l2norm::Problem;
  using Choice = l2norm::Choice;

  /// Validates a call (InvalidArgument naming the argument, its value and what is accepted).
  static Problem check(const Args& args);
  /// Pure: the plan for `problem` on a device with `limits`.
  static Planned<Choice> plan(const Problem& problem, const DeviceLimits& limits);
  static std::size_t workspace_bytes(const Problem&, const Choice&) { return 0; }
  static bool launches_nothing(const Problem& problem) {
    return problem.tokens == 0 || problem.q_heads + problem.k_heads == 0;
  }
  static QkL2NormParams params(const Args& args, const Problem& problem, const Choice& choice,
                               void* workspace);
};

/// float64 CPU reference of one row: out[i] = x[i] / sqrt(sum_j x[j]^2 + eps).
void reference_row(const double* x, double* out, std::int64_t dim, double eps);

}  // namespace kjit::ops::l2norm
