// SPDX-License-Identifier: Apache-2.0
// float64 reference of the Gated DeltaNet prefill (../shared/reference/kernels.md section 4.4):
// token by token, the sequential recurrence, on host buffers.
#pragma once

#include "kjit/ops/gdn_prefill.hpp"

namespace kjit::ops {

/// Runs gdn_prefill's semantics on host memory: every TensorView (and options.final_state)
/// points to host data with the same shapes, dtypes and strides gdn_prefill accepts (strides are
/// honoured everywhere, so any layout works here). out is written for every token; final
/// states are rounded to the state dtype and written like gdn_prefill does (pool slot in place,
/// skipped for padding; or options.final_state[n] for every sequence). Arguments are not
/// validated beyond what indexing needs: call plan_gdn_prefill first for that.
void gdn_prefill_reference(const TensorView& q, const TensorView& k, const TensorView& v,
                           const GdnGates& gates, const TensorView& cu_seqlens,
                           const TensorView& state, const TensorView& state_indices,
                           const TensorView& has_initial_state, const TensorView& out,
                           const GdnPrefillOptions& options);

}  // namespace kjit::ops
