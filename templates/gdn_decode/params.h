// SPDX-License-Identifier: Apache-2.0
// Parameter block of the Gated DeltaNet packed decode kernel (templates/gdn_decode/gdn_decode.cuh),
// shared with host code (lib/ops/gdn_decode.cpp).
#pragma once

#include "templates/common/gdn_state_layout.h"
#include "templates/common/types.h"

namespace kjit {

/// Grid modes of gdn_decode_kernel (template parameter kMode).
enum GdnDecodeMode : int {
  /// grid (NV, B*HV): needs B*HV <= max grid y.
  kGdnDecodeFlat = 0,
  /// grid (NV, HV, B): needs HV <= max grid y and B <= max grid z.
  kGdnDecodeSplit = 1,
  /// grid (min(NV*B*HV, max grid x)): every tile on x, a grid-stride loop covers the rest.
  kGdnDecodeFolded = 2,
  /// grid (min(NV*B*HV, resident blocks)): each block walks tiles with a grid stride, loading
  /// the next tile into registers while finishing the current one.
  kGdnDecodePersistent = 3,
  /// As persistent, with the state tiles staged through a shared-memory ring filled by bulk
  /// copies (sm_90 and newer).
  kGdnDecodeBulk = 4,
};

/// Cache hint of the state pool's loads and stores (template parameters kLoadHint,
/// kStoreHint).
enum GdnCacheHint : int {
  /// .cs: streaming, evict first.
  kGdnHintStream = 0,
  /// No hint: the default caching policy.
  kGdnHintPlain = 1,
  /// Loads only: .L1::no_allocate.L2::256B, L2 fetches whole 256-byte blocks.
  kGdnHintL2Prefetch = 2,
  /// Loads only (flat, split, folded; 16-byte vectors, sm_80+): the tile is copied into shared
  /// memory by cp.async.cg and read from there twice, so no registers are held while it is in
  /// flight and a warp can have more rows of state on the way (dynamic shared memory: one
  /// tile, kBV * K state elements).
  kGdnHintStaged = 3,
};

/// Rows whose keys gdn_decode_order_kernel packs: the row number takes the low 24 bits of a key
/// (B <= 2^24), the slot the bits above (slots < 2^39).
constexpr int kGdnOrderRowBits = 24;
/// Threads of a gdn_decode_order_kernel block: 32 rows, each ranked by 8 threads.
constexpr int kGdnOrderThreads = 256;
constexpr int kGdnOrderRowsPerBlock = 32;

/// Which state indices mean "no state" (template parameter kInvalidRule).
enum GdnInvalidRule : int {
  /// index < 0 is invalid (SGLang; slot 0 is a real slot).
  kGdnInvalidNegative = 0,
  /// index <= 0 is invalid (vLLM; slot 0 is the null block).
  kGdnInvalidNonpositive = 1,
};

/// Arguments of one decode step. Pointers are typed by the kernel's template parameters; all
/// strides are in elements of the tensor they belong to.
struct GdnDecodeParams {
  /// [B, 2*H*K + HV*V] rows of [q | k | v]; last dim contiguous.
  const void* qkv;
  /// Raw form: a [B, HV] (decay input) and b [B, HV] (beta logit). Gated form: g [B, HV] f32
  /// (log decay) and beta [B, HV] f32.
  const void* a;
  const void* b;
  /// [HV] each; unused by the gated form.
  const void* a_log;
  const void* dt_bias;
  /// [num_slots, HV, V, K] pool, inner [HV, V, K] contiguous (kGdnStateVMajor) or its K and V
  /// strides swapped (kGdnStateKMajor); updated in place.
  void* state;
  /// [B] slot of each row.
  const void* indices;
  /// [B, HV, V]; inner [HV, V] contiguous.
  void* out;
  /// Rows in slot order (kOrdered): [B] keys slot * 2^24 + n, ascending, written by
  /// gdn_decode_order_kernel (an invalid row's slot is -1); row i of the grid is the row of
  /// key i. nullptr when the rows run in their given order.
  i64* order;
  i64 qkv_row_stride;
  i64 a_row_stride;
  i64 b_row_stride;
  i64 state_slot_stride;
  i64 index_stride;
  i64 out_row_stride;
  /// Slots in the pool: an index >= num_slots is treated as invalid (never written).
  i64 num_slots;
  /// B * HV * NV tiles in all (the loop bound of the folded, persistent and bulk modes).
  u64 total_tiles;
  u32 batch;
  u32 num_heads;
  u32 num_value_heads;
  /// HV / H: value heads per q/k head.
  u32 heads_per_group;
  float scale;
  float softplus_threshold;
};

}  // namespace kjit
