// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

// Same type as CUstream / cudaStream_t, declared here so that public headers need no CUDA
// headers.
struct CUstream_st;

namespace kjit {

/// A CUDA stream handle (CUstream or cudaStream_t); nullptr is the legacy default stream.
using Stream = CUstream_st*;

/// Element types kjit kernels read and write.
enum class DType : std::uint8_t { f16, bf16, f32, f64, i32, i64, u8, e4m3 };

/// Short lowercase name: "f16", "bf16", "f32", "f64", "i32", "i64", "u8", "e4m3".
std::string_view to_string(DType dtype) noexcept;
/// Size of one element in bytes.
std::size_t size_of(DType dtype) noexcept;
/// Parses a name from to_string() (also "fp16", "float16", "half", "bfloat16", "fp32",
/// "float32", "float", "int32", "int64", "uint8", "fp8e4m3"); throws InvalidArgument naming
/// `what` and the accepted names otherwise.
DType parse_dtype(std::string_view text, std::string_view what = "dtype");
/// Parses a whole decimal integer (the full text); throws InvalidArgument "<what> must be an
/// integer, got '<text>'" otherwise.
std::int64_t parse_int64(std::string_view text, std::string_view what);

/// A CUDA compile target: sm_<major><minor>[a|f].
struct Arch {
  int major = 0;
  int minor = 0;
  /// '\0' for the portable target, 'a' for architecture-specific (sm_90a), 'f' for
  /// family-specific (sm_100f).
  char variant = '\0';

  /// Compute capability as an integer: 90 for sm_90a.
  int sm() const noexcept { return major * 10 + minor; }
  /// "sm_90a".
  std::string str() const;
  /// Parses "sm_90", "sm_90a", "90", "9.0", "compute_90"; throws InvalidArgument otherwise.
  static Arch parse(std::string_view text);
  /// The same target without the a/f variant.
  Arch base() const noexcept { return Arch{major, minor, '\0'}; }

  friend bool operator==(const Arch&, const Arch&) = default;
  friend auto operator<=>(const Arch&, const Arch&) = default;
};

inline constexpr int kMaxRank = 4;

/// A non-owning view of device memory: pointer, dtype, shape and strides in elements.
/// Unused trailing dimensions have size 1 and stride 0.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::int64_t shape[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};

  /// A row-major contiguous view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  /// A view with explicit strides (in elements), same rank as shape.
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> strides);

  std::int64_t numel() const noexcept;
  bool is_contiguous() const noexcept;
  /// "bf16[4096, 128, 128] strides [16384, 128, 1]".
  std::string str() const;
};

}  // namespace kjit
