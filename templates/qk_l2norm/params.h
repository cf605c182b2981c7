// SPDX-License-Identifier: Apache-2.0
// Parameter block of the qk_l2norm kernel (templates/qk_l2norm/qk_l2norm.cuh), shared with host
// code (lib/ops/qk_l2norm/). Plain data only: it is passed by value as the one kernel argument.
#pragma once

#include "templates/common/types.h"

namespace kjit {

/// Threads of every qk_l2norm block (lanes x rows per block); the template's launch bounds.
inline constexpr int kQkL2NormBlockThreads = 256;

/// One launch normalizes the rows of q [T, Hq, D] and then those of k [T, Hk, D] (Hk = 0: no
/// k). Rows are numbered q first, token-major: row r < T * Hq is (r / Hq, r % Hq) of q, the
/// others (r' / Hk, r' % Hk) of k with r' = r - T * Hq. Strides in elements; the last
/// dimension is contiguous. An output may be its input (in place).
struct QkL2NormParams {
  const void* q;
  void* q_out;
  const void* k;
  void* k_out;
  i64 q_token_stride;
  i64 q_head_stride;
  i64 q_out_token_stride;
  i64 q_out_head_stride;
  i64 k_token_stride;
  i64 k_head_stride;
  i64 k_out_token_stride;
  i64 k_out_head_stride;
  /// T * Hq and T * (Hq + Hk).
  u64 q_rows;
  u64 rows;
  u32 q_heads;
  u32 k_heads;
  /// out = x * rsqrt(sum(x^2) + eps).
  float eps;
};

}  // namespace kjit
