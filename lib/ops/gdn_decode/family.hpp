// SPDX-License-Identifier: Apache-2.0
// gdn_decode on the op skeleton (ops/op.hpp): both gate forms share one Problem, one planner
// and one kernel family.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/types.hpp"
#include "ops/op.hpp"
#include "ops/tensor_checks.hpp"
#include "templates/gdn_decode/conv_params.h"
#include "templates/gdn_decode/params.h"

namespace kjit::ops::decode {

enum class Form : std::uint8_t { raw, gated };

inline std::string_view op_name(Form form) {
  return form == Form::raw ? "gdn_decode" : "gdn_decode_gated";
}

/// The argument checks of a call of `form` (its errors name the op).
inline ArgChecks checks(Form form) { return ArgChecks(op_name(form)); }

/// Grid modes; `planner` when options.force_mode is empty. kModeNames spells them.
enum class Mode : std::uint8_t { planner, flat, split, folded, persistent, bulk };
inline constexpr const char* kModeNames[] = {"", "flat", "split", "folded", "persistent", "bulk"};

/// Cache hints of the state pool's accesses (options.force_cache_hints "<load>/<store>").
enum class LoadHint : std::uint8_t { stream, plain, l2_256, staged };
enum class StoreHint : std::uint8_t { stream, plain };
inline constexpr const char* kLoadHintNames[] = {"stream", "plain", "l2_256", "staged"};
inline constexpr const char* kStoreHintNames[] = {"stream", "plain"};

/// Layout of the pool's [HV, V, K] block, read from its strides: vk = K contiguous
/// (kGdnStateVMajor), kv = V contiguous (kGdnStateKMajor: a transposed view of [slots, HV, K,
/// V], fla's layout).
enum class StateLayout : std::uint8_t { vk, kv };
inline constexpr const char* kStateLayoutNames[] = {"vk", "kv"};

/// The arguments of one call. a_log and dt_bias are null in the gated form.
struct Args {
  Form form = Form::raw;
  const TensorView* qkv = nullptr;
  const TensorView* a = nullptr;
  const TensorView* b = nullptr;
  const TensorView* a_log = nullptr;
  const TensorView* dt_bias = nullptr;
  const TensorView* state = nullptr;
  const TensorView* indices = nullptr;
  const TensorView* out = nullptr;
  const GdnDecodeOptions* options = nullptr;
};

/// Everything validated about one call, options included; the plan is a function of it and the
/// device, and it is the plan memo's key (no pointer values: the pool's alignment class stands
/// in for its address).
struct Problem {
  std::int64_t batch = 0, heads = 0, value_heads = 0, k = 0, v = 0, slots = 0;
  std::int64_t qkv_row_stride = 0, a_row_stride = 0, b_row_stride = 0, slot_stride = 0,
               index_stride = 0, out_row_stride = 0;
  std::int32_t vec_bytes = 16;
  /// options.scale or K^-0.5, as its bits (a float's bytes are not its value: 0.0 and -0.0).
  std::uint32_t scale_bits = 0;
  std::int32_t force_bv = 0;
  std::int32_t force_stages = 0;
  std::int32_t force_blocks_per_sm = 0;
  GdnRowOrder row_order = GdnRowOrder::automatic;
  GdnInvalidIndex invalid_index = GdnInvalidIndex::negative;
  DType qkv = DType::f32, gate = DType::f32, a_log = DType::f32, dt_bias = DType::f32;
  DType state = DType::f32, out = DType::f32, index = DType::i32;
  Form form = Form::raw;
  Mode forced_mode = Mode::planner;
  bool l2norm = true;
  /// options.force_cache_hints was given (then load_hint/store_hint are what it says).
  bool hints_forced = false;
  LoadHint load_hint = LoadHint::stream;
  StoreHint store_hint = StoreHint::stream;
  StateLayout state_layout = StateLayout::vk;
  /// Keeps the size a multiple of 8 with every byte a member (the memo hashes the bytes).
  std::uint8_t unused[6] = {};

  float scale() const { return std::bit_cast<float>(scale_bits); }
};
static_assert(std::has_unique_object_representations_v<Problem> && sizeof(Problem) % 8 == 0);

/// The planner's decisions the launch needs.
struct Choice {
  /// State rows per block.
  std::int32_t bv = 0;
  /// Rows in slot order: a ranking kernel first, B x 8 bytes of workspace.
  bool ordered = false;
};

struct Family {
  static constexpr const char* kName = "gdn_decode";
  using Problem = decode::Problem;
  using Choice = decode::Choice;

  static Problem check(const Args& args);
  static Planned<Choice> plan(const Problem& problem, const DeviceLimits& device);
  /// The ranking kernel's keys: one 8-byte key per row.
  static std::size_t workspace_bytes(const Problem& problem, const Choice& choice) {
    return choice.ordered ? static_cast<std::size_t>(problem.batch) * 8 : 0;
  }
  static bool launches_nothing(const Problem&) { return false; }
  static GdnDecodeParams params(const Args& args, const Problem& problem, const Choice& choice,
                                void* workspace);
};

/// The spec parameters the plain and the fused step share (element types, head dims, form, the
/// q/k norm and the index rule); KernelSpec::make puts them in the family's order.
std::vector<std::pair<std::string, std::string>> step_spec_params(const Problem& p);

/// The fields GdnDecodeParams and GdnDecodeConvParams share (pointers, strides, sizes, scale),
/// from the call's arguments and its checked problem.
template <typename Params>
void fill_step_params(Params& params, const Args& args, const Problem& p) {
  params.qkv = args.qkv->data;
  params.a = args.a->data;
  params.b = args.b->data;
  params.a_log = args.a_log != nullptr ? args.a_log->data : nullptr;
  params.dt_bias = args.dt_bias != nullptr ? args.dt_bias->data : nullptr;
  params.state = args.state->data;
  params.indices = args.indices->data;
  params.out = args.out->data;
  params.qkv_row_stride = p.qkv_row_stride;
  params.a_row_stride = p.a_row_stride;
  params.b_row_stride = p.b_row_stride;
  params.state_slot_stride = p.slot_stride;
  params.index_stride = p.index_stride;
  params.out_row_stride = p.out_row_stride;
  params.num_slots = p.slots;
  params.batch = static_cast<u32>(p.batch);
  params.num_heads = static_cast<u32>(p.heads);
  params.num_value_heads = static_cast<u32>(p.value_heads);
  params.heads_per_group = static_cast<u32>(p.value_heads / p.heads);
  params.scale = p.scale();
  params.softplus_threshold = args.options->softplus_threshold;
}

/// The fused decode step (options.conv set): the conv update and the delta rule in one kernel
/// (templates/gdn_decode/conv.cuh). Its own family, so the plain step's problems, plans and
/// memo entries are what they were without it.
struct ConvProblem {
  /// The step's problem, checked as without the conv (mixed_qkv has the same [B, D] shape
  /// before the convolution as after it).
  Problem step;
  std::int64_t weight_channel_stride = 0, weight_tap_stride = 0, bias_stride = 0;
  std::int64_t conv_slot_stride = 0, conv_channel_stride = 0, conv_column_stride = 0;
  std::int16_t width = 0;
  /// GdnDecodeConv::force_cluster (0: the planner's choice).
  std::int16_t force_cluster = 0;
  DType weight = DType::f32, conv_state = DType::f32;
  bool has_bias = false;
  bool silu = true;
  /// GdnDecodeConv::force_stages (0: the planner's choice; 64 bits: the problem has no padding).
  std::int64_t force_stages = 0;
};
static_assert(std::has_unique_object_representations_v<ConvProblem> &&
              sizeof(ConvProblem) % 8 == 0);

struct ConvChoice {
  /// Warps per block (one block per (row, q/k head)).
  std::int32_t warps = 0;
};

struct ConvFamily {
  static constexpr const char* kName = "gdn_decode_conv";
  using Problem = decode::ConvProblem;
  using Choice = decode::ConvChoice;

  static ConvProblem check(const Args& args);
  static Planned<ConvChoice> plan(const ConvProblem& problem, const DeviceLimits& device);
  static std::size_t workspace_bytes(const ConvProblem&, const ConvChoice&) { return 0; }
  static bool launches_nothing(const ConvProblem&) { return false; }
  static GdnDecodeConvParams params(const Args& args, const ConvProblem& problem,
                                    const ConvChoice& choice, void* workspace);
};

}  // namespace kjit::ops::decode
