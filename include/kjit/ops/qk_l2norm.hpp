// SPDX-License-Identifier: Apache-2.0
// qk_l2norm: L2-normalizes every [D] row of q [T, Hq, D] and, in the same launch, of k
// [T, Hk, D]: out = x * rsqrt(sum(x^2) + eps), computed in f32 and rounded to the input's dtype.
// eps sits inside the root, as in fla's l2norm_fwd (1 / sqrt(sum x^2 + eps), eps = 1e-6) and
// the in-kernel q/k normalization of the GDN kernels of fla, vLLM, SGLang and FlashInfer
// (use_qk_l2norm_in_kernel), so a zero row stays zero.
#pragma once

#include "kjit/device.hpp"
#include "kjit/plan.hpp"
#include "kjit/types.hpp"

namespace kjit {

class Runtime;

/// Options of qk_l2norm.
struct QkL2NormOptions {
  /// Added to the sum of squares inside the root; finite and >= 0.
  float eps = 1e-6f;
  /// CUDA device ordinal; -1: the stream's device (for the default stream, the calling
  /// thread's current device). A device other than the stream's is an InvalidArgument.
  int device = -1;
  /// nullptr: Runtime::global().
  Runtime* runtime = nullptr;
};

/// q_out <- l2norm(q) and k_out <- l2norm(k) in one launch. q, q_out: [T, Hq, D]; k, k_out:
/// [T, Hk, D] with q's T and D (Hk may differ from Hq: grouped heads), or views with data ==
/// nullptr (any shape) to normalize q alone. Dtype f16, bf16 or f32, the same for all four; D a
/// multiple of 8 in 8..512. Any token and head strides (the last dimension contiguous); an
/// output may be its input (the same pointer and strides: in place), otherwise outputs must
/// not overlap inputs or each other. 16-byte accesses where every pointer and stride allows,
/// narrower ones otherwise. Enqueued on `stream`; no rows launches nothing.
void qk_l2norm(const TensorView& q, const TensorView& k, const TensorView& q_out,
               const TensorView& k_out, const QkL2NormOptions& options = {},
               Stream stream = nullptr);

/// The plan qk_l2norm would launch on a device with `limits`; launches nothing, needs no GPU.
/// options.device and options.runtime are ignored.
Plan plan_qk_l2norm(const TensorView& q, const TensorView& k, const TensorView& q_out,
                    const TensorView& k_out, const QkL2NormOptions& options,
                    const DeviceLimits& limits);

}  // namespace kjit
