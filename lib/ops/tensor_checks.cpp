// SPDX-License-Identifier: Apache-2.0
// The argument-check vocabulary of the op families (tensor_checks.hpp).
#include "ops/tensor_checks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <unordered_set>

#include "kjit/error.hpp"

namespace kjit::ops {

std::string shape_text(const TensorView& view) {
  std::string out = "[";
  for (int i = 0; i < view.rank; ++i) out += fmt::format("{}{}", i ? ", " : "", view.shape[i]);
  return out + "]";
}

std::int64_t align_of_bytes(std::uint64_t value) {
  if (value == 0) return 16;
  return std::min<std::int64_t>(16, std::int64_t{1} << std::countr_zero(value));
}

std::uint64_t magnitude(std::int64_t value) {
  return value < 0 ? static_cast<std::uint64_t>(-(value + 1)) + 1
                   : static_cast<std::uint64_t>(value);
}

namespace {

/// [lowest, highest] byte addresses a view touches; {1, 0} when it is empty.
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const TensorView& v) {
  auto lo = reinterpret_cast<std::intptr_t>(v.data), hi = lo;
  const auto esize = static_cast<std::intptr_t>(size_of(v.dtype));
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] == 0) return {1, 0};
    const std::intptr_t span = (v.shape[i] - 1) * v.strides[i] * esize;
    (span < 0 ? lo : hi) += span;
  }
  return {static_cast<std::uintptr_t>(lo), static_cast<std::uintptr_t>(hi) + size_of(v.dtype) - 1};
}

}  // namespace

bool overlaps(const TensorView& a, const TensorView& b) {
  const auto [a0, a1] = byte_range(a);
  const auto [b0, b1] = byte_range(b);
  return a0 <= a1 && b0 <= b1 && a0 <= b1 && b0 <= a1;
}

void ArgChecks::fail(std::string_view message) const {
  throw InvalidArgument(fmt::format("{}: {}", op_, message));
}

void ArgChecks::fail(std::string_view argument, const TensorView& view,
                     std::string_view accepted) const {
  throw InvalidArgument(fmt::format("{}: {} is {}; {}", op_, argument, view.str(), accepted));
}

void ArgChecks::rank(std::string_view argument, const TensorView& view, int rank,
                     std::string_view layout) const {
  if (view.rank == rank) return;
  fail(fmt::format("{} has rank {} ({}); expected rank {}: {}", argument, view.rank, view.str(),
                   rank, layout));
}

void ArgChecks::extents(std::string_view argument, const TensorView& view) const {
  for (int i = 0; i < view.rank; ++i) {
    if (view.shape[i] < 0) fail(fmt::format("{} {} has a negative extent", argument, view.str()));
  }
}

void ArgChecks::dtype_in(std::string_view argument, const TensorView& view,
                         std::initializer_list<DType> accepted) const {
  if (std::find(accepted.begin(), accepted.end(), view.dtype) != accepted.end()) return;
  std::string list;
  for (const DType d : accepted)
    list += fmt::format("{}{}", list.empty() ? "" : ", ", to_string(d));
  fail(fmt::format("{} has dtype {}; accepted: {}", argument, to_string(view.dtype), list));
}

void ArgChecks::dtype_of(std::string_view argument, const TensorView& view, DType expected,
                         std::string_view whose) const {
  if (view.dtype == expected) return;
  fail(fmt::format("{} has dtype {}; accepted: {} ({})", argument, to_string(view.dtype),
                   to_string(expected), whose));
}

void ArgChecks::shape(std::string_view argument, const TensorView& view,
                      std::initializer_list<std::int64_t> expected, std::string_view what) const {
  bool same = view.rank == static_cast<int>(expected.size());
  for (int i = 0; same && i < view.rank; ++i) same = view.shape[i] == expected.begin()[i];
  if (same) return;
  std::string want = "[";
  int i = 0;
  for (const std::int64_t e : expected) want += fmt::format("{}{}", i++ ? ", " : "", e);
  fail(fmt::format("{} has shape {}; expected {} = {}]", argument, shape_text(view), what, want));
}

void ArgChecks::dim(std::string_view argument, const TensorView& view, int dim,
                    std::int64_t expected, std::string_view what) const {
  if (view.shape[dim] == expected) return;
  fail(fmt::format("{} dim {} is {}, expected {} ({}); {}", argument, dim, view.shape[dim],
                   expected, what, view.str()));
}

void ArgChecks::not_null(std::string_view argument, const TensorView& view,
                         bool empty_may_be_null) const {
  if (view.data != nullptr || (empty_may_be_null && view.numel() == 0)) return;
  fail(fmt::format("{} data pointer is null ({}); accepted: the address of its elements{}",
                   argument, view.str(), empty_may_be_null ? " (null only when it is empty)" : ""));
}

void ArgChecks::aligned(std::string_view argument, const TensorView& view, std::uintptr_t bytes,
                        std::string_view why) const {
  const auto address = reinterpret_cast<std::uintptr_t>(view.data);
  if (address % bytes == 0) return;
  fail(fmt::format(
      "{} data pointer {:#x} is not aligned: it must be {}-byte aligned{}{}{}; "
      "accepted: a multiple of {}",
      argument, address, bytes, why.empty() ? "" : " (", why, why.empty() ? "" : ")", bytes));
}

void ArgChecks::element_aligned(std::string_view argument, const TensorView& view) const {
  const std::size_t esize = size_of(view.dtype);
  if (reinterpret_cast<std::uintptr_t>(view.data) % esize == 0) return;
  aligned(argument, view, esize, fmt::format("its element size, {}", to_string(view.dtype)));
}

void ArgChecks::unit_last_stride(std::string_view argument, const TensorView& view,
                                 std::string_view why, bool extent_one_any) const {
  const int last = view.rank - 1;
  if (view.strides[last] == 1 || (extent_one_any && view.shape[last] <= 1)) return;
  fail(fmt::format("{} {} has last-dimension stride {}; accepted: 1 ({})", argument, view.str(),
                   view.strides[last], why));
}

void ArgChecks::contiguous(std::string_view argument, const TensorView& view) const {
  if (view.shape[0] <= 1 || view.strides[0] == 1) return;
  fail(fmt::format("{} must be contiguous, got {}", argument, view.str()));
}

void ArgChecks::tokens_in_groups(std::string_view offsets, std::string_view count_name,
                                 std::string_view groups, std::int64_t count,
                                 std::string_view tokens_argument, std::int64_t tokens) const {
  if (count > 0 || tokens == 0) return;
  fail(
      fmt::format("{} holds 1 offset ({} = 0 {}) but {} has T = {} tokens; accepted: {} >= 1 {} "
                  "whose offsets end at T, or T = 0",
                  offsets, count_name, groups, tokens_argument, tokens, count_name, groups));
}

void ArgChecks::stride_multiple(std::string_view argument, const TensorView& view, int dim,
                                std::int64_t elements) const {
  if (view.shape[dim] <= 1 || view.strides[dim] % elements == 0) return;
  fail(fmt::format("{} stride of dim {} is {}; it must be a multiple of {} elements ({})", argument,
                   dim, view.strides[dim], elements, view.str()));
}

void ArgChecks::no_broadcast(std::string_view argument, const TensorView& view) const {
  for (int i = 0; i < view.rank; ++i) {
    if (view.shape[i] > 1 && view.strides[i] == 0) {
      fail(
          fmt::format("{} {} has stride 0 in dimension {} of extent {}; outputs must not overlap "
                      "themselves",
                      argument, view.str(), i, view.shape[i]));
    }
  }
}

void ArgChecks::slot_indices(std::string_view argument, std::span<const std::int64_t> indices,
                             std::int64_t slots, bool nonpositive_is_padding,
                             std::string_view rows) const {
  std::unordered_set<std::int64_t> seen;
  for (std::size_t n = 0; n < indices.size(); ++n) {
    const std::int64_t slot = indices[n];
    if (nonpositive_is_padding ? slot <= 0 : slot < 0) continue;
    if (slot >= slots) {
      fail(fmt::format("{}[{}] = {} is out of range; the pool has {} slots (debug check)", argument,
                       n, slot, slots));
    }
    if (!seen.insert(slot).second) {
      fail(
          fmt::format("{}[{}] = {} repeats an earlier valid index; {} of one call must use "
                      "distinct slots (debug check)",
                      argument, n, slot, rows));
    }
  }
}

}  // namespace kjit::ops
