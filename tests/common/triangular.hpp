// SPDX-License-Identifier: Apache-2.0
// T = (I + A)^-1 in float64 for a strictly lower triangular A: the chunk inverse of the Gated
// DeltaNet WY form, as the tests' references compute it (the kernels' own inverse is checked
// against this, and the prefill reference's chunked form is built on it).
#pragma once

#include <cstddef>
#include <vector>

namespace kjit::test {

/// (I + A)^-1 of the n x n strictly lower triangular `a` (row-major; entries on and above the
/// diagonal are not read), by forward substitution: T_ii = 1, T_ij = -sum_{m=j}^{i-1} A_im T_mj
/// for i > j (the terms added in the order m = j, j + 1, ...), zero above the diagonal.
inline std::vector<double> unit_lower_inverse(const std::vector<double>& a, std::size_t n) {
  std::vector<double> t(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    t[i * n + i] = 1.0;
    for (std::size_t j = 0; j < i; ++j) {
      double sum = 0;
      for (std::size_t m = j; m < i; ++m) sum += a[i * n + m] * t[m * n + j];
      t[i * n + j] = -sum;
    }
  }
  return t;
}

}  // namespace kjit::test
