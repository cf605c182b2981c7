// SPDX-License-Identifier: Apache-2.0
// The one vocabulary of argument checks every op family's check() is written in (issue 21): rank,
// extents, dtype, shape, data pointer, alignment, strides. Each check throws InvalidArgument in
// one message style,
//
//   "<op>: <argument> <what it is (its value)>; <what is accepted>"
//
// e.g. "merge_state: s_a has dtype f16; accepted: f32" or "causal_conv1d: x data pointer 0x1 is
// not aligned: it must be 2-byte aligned (its element size, bf16); accepted: a multiple of 2".
// A check of one family's own (a layout, a relation between arguments) goes through fail(): the
// same prefix, and `fail(argument, view, accepted)` for "<argument> is <view>; <accepted>".
//
// The checks run on every call: on success they format nothing and allocate nothing.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kjit/types.hpp"

namespace kjit::ops {

/// "[2, 3]": a view's shape alone (the dtype and strides are in TensorView::str()).
std::string shape_text(const TensorView& view);

/// Largest power of two <= 16 dividing `value` (an address or a stride in bytes); 0 gives 16.
std::int64_t align_of_bytes(std::uint64_t value);

/// |value| without overflow at INT64_MIN.
std::uint64_t magnitude(std::int64_t value);

/// Whether the bytes two views touch (from the lowest to the highest element) intersect; an
/// empty view touches nothing.
bool overlaps(const TensorView& a, const TensorView& b);

/// The checks of one op's arguments; `op` prefixes every message.
class ArgChecks {
 public:
  explicit constexpr ArgChecks(std::string_view op) : op_(op) {}

  std::string_view op() const { return op_; }

  /// "<op>: <message>".
  [[noreturn]] void fail(std::string_view message) const;
  /// "<op>: <argument> is <view.str()>; <accepted>".
  [[noreturn]] void fail(std::string_view argument, const TensorView& view,
                         std::string_view accepted) const;

  /// rank == `rank`: "<argument> has rank r (<view>); expected rank R: <layout>".
  void rank(std::string_view argument, const TensorView& view, int rank,
            std::string_view layout) const;
  /// No negative extent in the first `rank` dimensions.
  void extents(std::string_view argument, const TensorView& view) const;

  /// dtype one of `accepted`: "<argument> has dtype d; accepted: a, b, c".
  void dtype_in(std::string_view argument, const TensorView& view,
                std::initializer_list<DType> accepted) const;
  /// f16, bf16 or f32.
  void float_dtype(std::string_view argument, const TensorView& view) const {
    dtype_in(argument, view, {DType::f16, DType::bf16, DType::f32});
  }
  /// i32 or i64.
  void index_dtype(std::string_view argument, const TensorView& view) const {
    dtype_in(argument, view, {DType::i32, DType::i64});
  }
  /// dtype == `expected` (the dtype of another argument, `whose` says which):
  /// "<argument> has dtype d; accepted: e (<whose>)".
  void dtype_of(std::string_view argument, const TensorView& view, DType expected,
                std::string_view whose) const;

  /// shape == `expected`: "<argument> has shape [..]; expected <what> = [..]".
  void shape(std::string_view argument, const TensorView& view,
             std::initializer_list<std::int64_t> expected, std::string_view what) const;
  /// shape[dim] == `expected`: "<argument> dim d is x, expected e (<what>); <view>".
  void dim(std::string_view argument, const TensorView& view, int dim, std::int64_t expected,
           std::string_view what) const;

  /// A data pointer (null only where `empty_may_be_null` and the view is empty: an empty tensor
  /// is never dereferenced): "<argument> data pointer is null (<view>); accepted: ...".
  void not_null(std::string_view argument, const TensorView& view,
                bool empty_may_be_null = true) const;
  /// The data pointer a multiple of `bytes` (`why`: where the requirement comes from).
  void aligned(std::string_view argument, const TensorView& view, std::uintptr_t bytes,
               std::string_view why = {}) const;
  /// The data pointer a multiple of the element size.
  void element_aligned(std::string_view argument, const TensorView& view) const;
  /// not_null + element_aligned.
  void memory(std::string_view argument, const TensorView& view) const {
    not_null(argument, view);
    element_aligned(argument, view);
  }

  /// Stride 1 in the last dimension (also for extent 1 unless `extent_one_any`):
  /// "<argument> <view> has last-dimension stride s; accepted: 1 (<why>)".
  void unit_last_stride(std::string_view argument, const TensorView& view, std::string_view why,
                        bool extent_one_any = false) const;
  /// A 1-D view of contiguous elements: "<argument> must be contiguous, got <view>".
  void contiguous(std::string_view argument, const TensorView& view) const;
  /// strides[dim] a multiple of `elements` where shape[dim] > 1.
  void stride_multiple(std::string_view argument, const TensorView& view, int dim,
                       std::int64_t elements) const;
  /// No stride 0 along a dimension of extent > 1 (an output's elements would alias).
  void no_broadcast(std::string_view argument, const TensorView& view) const;

  /// Offsets of `count` groups (`offsets`: [count + 1], e.g. cu_seqlens) over `tokens` rows of
  /// `tokens_argument`: with no group, no token may be left (the last offset is T, and nothing
  /// would be launched to write the tokens' outputs): "<offsets> holds 1 offset (<count_name> = 0
  /// <groups>) but <tokens_argument> has T = t tokens; accepted: ...". The offsets themselves stay
  /// on the device.
  void tokens_in_groups(std::string_view offsets, std::string_view count_name,
                        std::string_view groups, std::int64_t count,
                        std::string_view tokens_argument, std::int64_t tokens) const;

  /// Slot indices read back from the device (debug checks): every index that is not padding
  /// (< 0, or <= 0 with `nonpositive_is_padding`) is below `slots` and appears once; `rows` says
  /// whose indices they are ("rows", "sequences").
  void slot_indices(std::string_view argument, std::span<const std::int64_t> indices,
                    std::int64_t slots, bool nonpositive_is_padding, std::string_view rows) const;

 private:
  std::string_view op_;
};

}  // namespace kjit::ops
