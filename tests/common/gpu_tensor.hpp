// SPDX-License-Identifier: Apache-2.0
// A host tensor with explicit strides and its device twin, for GPU tests that fill inputs on the
// host, upload them, and compare what comes back (gdn_decode and its fused conv step).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common/gpu.hpp"
#include "kjit/types.hpp"
#include "support/numeric.hpp"

namespace kjit::test {

/// A host tensor with explicit strides (in elements) and a device buffer of the same bytes.
struct Tensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape, strides;
  std::vector<unsigned char> host;
  DeviceBuffer device{1};

  Tensor(DType d, std::vector<std::int64_t> s, std::vector<std::int64_t> st = {})
      : dtype(d), shape(std::move(s)), strides(std::move(st)) {
    if (strides.empty()) {
      strides.assign(shape.size(), 1);
      for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
        strides[i] = strides[i + 1] * shape[i + 1];
      }
    }
    std::int64_t span = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) span += (shape[i] - 1) * strides[i];
    host.assign(static_cast<std::size_t>(span) * size_of(dtype), 0);
    device = DeviceBuffer(host.size());
  }
  std::int64_t elements() const { return static_cast<std::int64_t>(host.size() / size_of(dtype)); }
  double get(std::int64_t i) const { return support::load_as_double(host.data(), dtype, i); }
  void set(std::int64_t i, double v) { support::store_from_double(host.data(), dtype, i, v); }
  TensorView view(bool on_device) {
    TensorView t;
    t.data = on_device ? device.get() : host.data();
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    for (int i = 0; i < t.rank; ++i) {
      t.shape[i] = shape[i];
      t.strides[i] = strides[i];
    }
    return t;
  }
  // Copies are ordered against the suite's stream explicitly (it is non-blocking, so the
  // synchronous copies would not wait for it).
  void upload() {
    sync();
    check_cu(cu().cuMemcpyHtoD(device.ptr(), host.data(), host.size()), "cuMemcpyHtoD");
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> bytes(host.size());
    sync();
    check_cu(cu().cuMemcpyDtoH(bytes.data(), device.ptr(), bytes.size()), "cuMemcpyDtoH");
    return bytes;
  }
  /// 0xFF bytes: NaN in every float format, so unwritten outputs fail the comparison.
  void poison() {
    check_cu(
        cu().cuMemsetD8Async(device.ptr(), 0xFF, host.size(), reinterpret_cast<CUstream>(stream())),
        "cuMemsetD8Async");
    sync();
  }
  /// Every element (padding included) drawn from N(0, sigma).
  void fill(Rng& rng, double sigma) {
    std::normal_distribution<double> normal(0.0, sigma);
    for (std::int64_t i = 0; i < elements(); ++i) set(i, normal(rng));
  }
};

}  // namespace kjit::test
