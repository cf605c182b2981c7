// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <string>

#include "kjit/error.hpp"
#include "kjit/types.hpp"

namespace kjit {

std::string_view to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::e4m3:
      return "e4m3";
  }
  return "?";
}

std::size_t size_of(DType dtype) noexcept {
  switch (dtype) {
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::u8:
    case DType::e4m3:
      return 1;
  }
  return 0;
}

std::int64_t parse_int64(std::string_view text, std::string_view what) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw InvalidArgument(fmt::format("{} must be an integer, got '{}'", what, text));
  }
  return value;
}

DType parse_dtype(std::string_view text, std::string_view what) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f16", DType::f16},
      {"fp16", DType::f16},
      {"float16", DType::f16},
      {"half", DType::f16},
      {"bf16", DType::bf16},
      {"bfloat16", DType::bf16},
      {"f32", DType::f32},
      {"fp32", DType::f32},
      {"float32", DType::f32},
      {"float", DType::f32},
      {"f64", DType::f64},
      {"fp64", DType::f64},
      {"float64", DType::f64},
      {"double", DType::f64},
      {"i32", DType::i32},
      {"int32", DType::i32},
      {"i64", DType::i64},
      {"int64", DType::i64},
      {"u8", DType::u8},
      {"uint8", DType::u8},
      {"e4m3", DType::e4m3},
      {"fp8e4m3", DType::e4m3},
      {"float8_e4m3fn", DType::e4m3},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == text) return alias.dtype;
  }
  throw InvalidArgument(
      fmt::format("{} '{}' is not a dtype kjit knows; accepted: f16, bf16, f32, "
                  "f64, i32, i64, u8, e4m3",
                  what, text));
}

std::string Arch::str() const {
  std::string out = "sm_" + std::to_string(major) + std::to_string(minor);
  if (variant != '\0') out.push_back(variant);
  return out;
}

Arch Arch::parse(std::string_view text) {
  const std::string original(text);
  auto fail = [&]() -> Arch {
    throw InvalidArgument(fmt::format(
        "arch '{}' is not a CUDA target; expected sm_XY, sm_XYa or sm_XYf (e.g. sm_90, sm_90a, "
        "sm_100f), XY or X.Y",
        original));
  };
  if (text.starts_with("sm_")) {
    text.remove_prefix(3);
  } else if (text.starts_with("compute_")) {
    text.remove_prefix(8);
  }
  Arch arch;
  if (!text.empty() && (text.back() == 'a' || text.back() == 'f')) {
    arch.variant = text.back();
    text.remove_suffix(1);
  }
  if (const std::size_t dot = text.find('.'); dot != std::string_view::npos) {
    int major = 0, minor = 0;
    auto [p1, e1] = std::from_chars(text.data(), text.data() + dot, major);
    auto [p2, e2] = std::from_chars(text.data() + dot + 1, text.data() + text.size(), minor);
    if (e1 != std::errc() || e2 != std::errc() || p1 != text.data() + dot ||
        p2 != text.data() + text.size() || minor > 9 || major < 1) {
      return fail();
    }
    arch.major = major;
    arch.minor = minor;
    return arch;
  }
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value < 10 || value > 999) {
    return fail();
  }
  arch.major = value / 10;
  arch.minor = value % 10;
  return arch;
}

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape) {
  if (shape.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument(
        fmt::format("TensorView rank {} exceeds the maximum {}", shape.size(), kMaxRank));
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.rank = static_cast<int>(shape.size());
  int i = 0;
  for (std::int64_t extent : shape) view.shape[i++] = extent;
  // Checked: a shape whose element count exceeds int64 (sizes from a command line or a
  // manifest) would otherwise overflow here, which is undefined behaviour (found by fuzzing
  // the planner under UBSan).
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.strides[d] = stride;
    if (__builtin_mul_overflow(stride, view.shape[d], &stride)) {
      std::string dims;
      for (std::int64_t extent : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(extent);
      throw InvalidArgument(fmt::format(
          "TensorView shape [{}] has more than 2^63 elements; each tensor's element count must "
          "fit in int64",
          dims));
    }
  }
  return view;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> strides) {
  if (shape.size() != strides.size()) {
    throw InvalidArgument(fmt::format("TensorView: shape has {} dims but strides have {}",
                                      shape.size(), strides.size()));
  }
  TensorView view = contiguous(data, dtype, shape);
  int i = 0;
  for (std::int64_t stride : strides) view.strides[i++] = stride;
  return view;
}

std::int64_t TensorView::numel() const noexcept {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::str() const {
  std::string out(to_string(dtype));
  out += "[";
  for (int d = 0; d < rank; ++d) out += fmt::format("{}{}", d ? ", " : "", shape[d]);
  out += "] strides [";
  for (int d = 0; d < rank; ++d) out += fmt::format("{}{}", d ? ", " : "", strides[d]);
  out += "]";
  return out;
}

}  // namespace kjit
