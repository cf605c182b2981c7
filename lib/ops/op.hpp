// SPDX-License-Identifier: Apache-2.0
// The skeleton every op family is written on (issue 21), in the shape of CUTLASS's
// can_implement -> get_workspace_size -> initialize -> run and DeepGEMM's heuristics/impls split.
// A family is a struct with static members:
//
//   Problem  check(args)                    validates the call; the result is everything the
//                                           plan depends on, and it is the plan memo's key, so
//                                           it is trivially copyable and padding-free (a
//                                           static_assert below says so at compile time).
//   Planned<Choice> plan(Problem, limits)   pure: the printable Plan and the typed Choice the
//                                           launch needs (no value is parsed back out of the
//                                           plan's strings).
//   size_t workspace_bytes(Problem, Choice) scratch memory of one call (0: none).
//   Params params(args, Problem, Choice, workspace)
//                                           the by-value parameter block of every launch.
//   bool launches_nothing(Problem)          a call that touches no device (empty problems).
//
// and optionally:
//
//   Problem memo_problem(Problem, limits)   the memo key of a call on a device, when the plans
//                                           of many problems are one (gdn_prefill: its plans
//                                           depend on the token count only through a decision
//                                           that needs the device, so the key holds that
//                                           decision instead of T); a miss plans the call's own
//                                           problem. Without it the key is the problem.
//   std::string workspace_hint(bytes)       what a failed workspace allocation's message adds
//                                           (in place of run()'s workspace_hint argument).
//   void attach_tensor_maps(Params&, Problem, Choice, Runtime&)
//                                           TMA tensor maps of the call's tensors into the
//                                           parameter block (they hold its pointers: encoded per
//                                           call, after params()).
//
// Every launch of a plan takes the same parameter block.
//
// run<Family>() does the rest, the same way for every family: picks the runtime and the
// device, looks the plan up in the memo (planning and resolving it on a miss), obtains the
// workspace from the runtime (stream-ordered, also under graph capture) and launches.
#pragma once

#include <fmt/format.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "kjit/plan.hpp"
#include "kjit/runtime.hpp"
#include "kjit/types.hpp"

namespace kjit::ops {

/// What a family's planner returns: the Plan (for explain(), `kjit plan`, the memo) and the
/// decisions the launch needs, as values.
template <typename Choice>
struct Planned {
  Plan plan;
  Choice choice{};
};

/// A Problem can be the memo key: its bytes are its value. Floats break this (0.0 and -0.0,
/// NaNs), so a family keeps a float it must key on as its bits.
template <typename Problem>
concept MemoKeyable =
    std::is_trivially_copyable_v<Problem> && std::has_unique_object_representations_v<Problem>;

template <typename Family>
concept OpFamily = MemoKeyable<typename Family::Problem> &&
    std::is_trivially_copyable_v<typename Family::Choice> &&
    requires(const typename Family::Problem& problem, const typename Family::Choice& choice,
             const DeviceLimits& limits) {
  { Family::kName } -> std::convertible_to<std::string_view>;
  { Family::plan(problem, limits) } -> std::same_as<Planned<typename Family::Choice>>;
  { Family::workspace_bytes(problem, choice) } -> std::same_as<std::size_t>;
  { Family::launches_nothing(problem) } -> std::same_as<bool>;
};

/// The plan memo's key: the family (two families' problems never compare equal, whatever their
/// bytes), the device, and the problem. Padding-free because the problem is and its size is a
/// multiple of 8 (checked below).
template <typename Problem>
struct MemoKey {
  std::uint64_t family = 0;
  std::int64_t device = 0;
  Problem problem;
};

/// A 64-bit tag of a family name, for MemoKey.
constexpr std::uint64_t family_tag(std::string_view name) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (const char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return hash;
}

/// Where a call runs (every op's options.device and options.runtime).
struct Target {
  int device = -1;
  Runtime* runtime = nullptr;
};

/// Runs one call of a family: memo lookup (plan + resolve on a miss), workspace, launches.
/// `before_launch(runtime, stream)` runs once the plan is known and before anything is enqueued
/// (gdn_decode's debug index check); `workspace_hint` is appended to a failed allocation's
/// message (what the caller can do instead).
template <OpFamily Family, typename Args, typename BeforeLaunch>
void run(const Args& args, const typename Family::Problem& problem, Target target, Stream stream,
         BeforeLaunch&& before_launch, std::string_view workspace_hint = {}) {
  using Problem = typename Family::Problem;
  using Choice = typename Family::Choice;
  static_assert(std::has_unique_object_representations_v<MemoKey<Problem>>,
                "the memo key must be padding-free: make sizeof(Problem) a multiple of 8");
  if (Family::launches_nothing(problem)) return;
  Runtime& runtime = target.runtime != nullptr ? *target.runtime : Runtime::global();
  const int device = runtime.device_of(stream, target.device);
  MemoKey<Problem> key{family_tag(Family::kName), device, problem};
  if constexpr (requires { Family::memo_problem(problem, runtime.device_limits(device)); }) {
    key.problem = Family::memo_problem(problem, runtime.device_limits(device));
  }
  const Runtime::ResolvedPlan& resolved = runtime.memoized(key, stream, [&] {
    Planned<Choice> planned = Family::plan(problem, runtime.device_limits(device));
    return Runtime::PlannedOn{std::move(planned.plan), device,
                              std::make_shared<const Choice>(planned.choice)};
  });
  before_launch(runtime, stream);
  if (resolved.plan.launches.empty()) return;
  const Choice& choice = *static_cast<const Choice*>(resolved.choice.get());
  const std::size_t bytes = Family::workspace_bytes(problem, choice);
  Workspace workspace;
  if (bytes > 0) {
    try {
      workspace = runtime.workspace(resolved, bytes, stream, Family::kName);
    } catch (const DriverError& error) {
      std::string hint(workspace_hint);
      if constexpr (requires { Family::workspace_hint(bytes); }) {
        hint = Family::workspace_hint(bytes);
      }
      if (hint.empty()) throw;
      throw DriverError(fmt::format("{}; {}", error.what(), hint), error.result(), error.call());
    }
  }
  auto params = Family::params(args, problem, choice, workspace.data());
  if constexpr (requires { Family::attach_tensor_maps(params, problem, choice, runtime); }) {
    Family::attach_tensor_maps(params, problem, choice, runtime);
  }
  for (std::size_t i = 0; i < resolved.plan.launches.size(); ++i) {
    runtime.launch(resolved, i, stream, &params, sizeof params);
  }
  // Freed on the stream after the launches; an error here is reported (the destructor, on the
  // exception path above, frees without throwing).
  workspace.release();
}

template <OpFamily Family, typename Args>
void run(const Args& args, const typename Family::Problem& problem, Target target, Stream stream) {
  run<Family>(args, problem, target, stream, [](Runtime&, Stream) {});
}

}  // namespace kjit::ops
