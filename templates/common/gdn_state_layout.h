// SPDX-License-Identifier: Apache-2.0
// Layouts of a Gated DeltaNet state [.., HV, V, K] that the GDN kernels accept, shared by the
// decode and prefill parameter blocks (and host code).
#pragma once

namespace kjit {

/// Layout of a state's [V, K] block per value head (template parameter kStateLayout).
enum GdnStateLayout : int {
  /// Element (v, k) at v * K + k: K contiguous (kjit's and vLLM's pools).
  kGdnStateVMajor = 0,
  /// Element (v, k) at k * V + v: V contiguous (fla's [N, HV, K, V] states, passed as their
  /// transpose).
  kGdnStateKMajor = 1,
};

}  // namespace kjit
