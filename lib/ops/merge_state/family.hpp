// SPDX-License-Identifier: Apache-2.0
// merge_state on the op skeleton (ops/op.hpp): the three entry points (pair, in place, many)
// share one Problem, one planner and one kernel family.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kjit/device.hpp"
#include "kjit/ops/merge_state.hpp"
#include "kjit/types.hpp"
#include "ops/op.hpp"
#include "templates/merge_state/params.h"

namespace kjit::ops::merge {

/// Which entry point a call came through.
enum class Entry : std::uint8_t { pair, in_place, many };

/// The public name of an entry point (plans and messages).
inline const char* op_name(Entry entry) {
  switch (entry) {
    case Entry::pair:
      return "merge_state";
    case Entry::in_place:
      return "merge_state_in_place";
    case Entry::many:
      return "merge_states";
  }
  return "merge_state";
}

/// The grid mode options.force_mode asks for (planner: none).
enum class ForcedMode : std::uint8_t { planner, token_major, flat };

/// The arguments of one call, as the entry point received them. For `many`, v_a/s_a are v/s
/// and v_b/s_b are null; `mask` is null unless in place.
struct Args {
  Entry entry = Entry::pair;
  const TensorView* v_a = nullptr;
  const TensorView* s_a = nullptr;
  const TensorView* v_b = nullptr;
  const TensorView* s_b = nullptr;
  const TensorView* v_out = nullptr;
  const TensorView* s_out = nullptr;
  const TensorView* mask = nullptr;
  const MergeStateOptions* options = nullptr;
};

/// Everything a plan depends on: no pointer values, only their alignment. The memo key.
struct Problem {
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t states = 0;
  /// min over the inputs / outputs of their alignment in bytes.
  std::int64_t in_align = 16;
  std::int64_t out_align = 16;
  Entry entry = Entry::pair;
  DType in = DType::bf16;
  DType out = DType::bf16;
  LseBase base = LseBase::two;
  bool pos_inf_as_empty = true;
  ForcedMode forced_mode = ForcedMode::planner;
  /// Vectors per thread forced by a ":c<n>" suffix of options.force_mode; 0: the planner's.
  std::uint8_t forced_chunks = 0;
  /// log2 of the threads per block forced by a ":t<n>" suffix; 0: the planner's. These two
  /// bytes keep the size a multiple of 8 with every byte a member (the memo hashes the bytes).
  std::uint8_t forced_block_log2 = 0;
};
static_assert(std::has_unique_object_representations_v<Problem> && sizeof(Problem) % 8 == 0);

/// The planner's decisions the launch needs, as values.
struct Choice {
  /// Elements per vector access, vectors per thread, threads per (token, head) row.
  std::int32_t vec = 1;
  std::int32_t chunks = 1;
  std::int32_t lanes = 1;
  MergeGridMode mode = MergeGridMode::token_major;
};

struct Family {
  static constexpr const char* kName = "merge_state";
  using Problem = merge::Problem;
  using Choice = merge::Choice;

  /// Validates a call (InvalidArgument naming the argument, its value and what is accepted).
  static Problem check(const Args& args);
  /// Pure: the plan for `problem` on a device with `limits` (PlanError if no mode is legal).
  static Planned<Choice> plan(const Problem& problem, const DeviceLimits& limits);
  static std::size_t workspace_bytes(const Problem&, const Choice&) { return 0; }
  /// T == 0 or H == 0: nothing to launch, no device needed.
  static bool launches_nothing(const Problem& problem) {
    return problem.tokens == 0 || problem.heads == 0;
  }
  static MergeStateParams params(const Args& args, const Problem& problem, const Choice& choice,
                                 void* workspace);
};

}  // namespace kjit::ops::merge
