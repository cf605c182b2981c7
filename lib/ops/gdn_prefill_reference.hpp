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
/// skipped for padding; or options.final_state[n] for every sequence). With
/// options.checkpoint_every_n_tokens > 0 and options.state_checkpoints given, checkpoints are
/// written like gdn_prefill does (rows from the host i64 options.checkpoint_cu_starts, padding
/// sequences included); any positive interval works here, not only multiples of 64. Arguments are
/// not validated beyond what indexing needs: call plan_gdn_prefill first for that.
void gdn_prefill_reference(const TensorView& q, const TensorView& k, const TensorView& v,
                           const GdnGates& gates, const TensorView& cu_seqlens,
                           const TensorView& state, const TensorView& state_indices,
                           const TensorView& has_initial_state, const TensorView& out,
                           const GdnPrefillOptions& options);

}  // namespace kjit::ops
