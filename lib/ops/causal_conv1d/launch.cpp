// SPDX-License-Identifier: Apache-2.0
// causal_conv1d: the kernel parameters of a checked call, the debug checks of the values behind
// the pointers, and the public entry points, which run on the op skeleton (ops/op.hpp).
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/runtime.hpp"
#include "ops/causal_conv1d/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit {
namespace ops::conv1d {
namespace {

std::int64_t read_int(const std::vector<unsigned char>& host, DType dtype, std::int64_t i) {
  if (dtype == DType::i64) {
    std::int64_t v = 0;
    std::memcpy(&v, host.data() + i * 8, 8);
    return v;
  }
  std::int32_t v = 0;
  std::memcpy(&v, host.data() + i * 4, 4);
  return v;
}

std::vector<unsigned char> to_host(Runtime& runtime, const TensorView& v, std::int64_t count,
                                   Stream stream) {
  const std::size_t esize = size_of(v.dtype);
  std::vector<unsigned char> strided(
      count > 0 ? static_cast<std::size_t>((count - 1) * v.strides[0] + 1) * esize : 0);
  if (!strided.empty()) runtime.copy_to_host(strided.data(), v.data, strided.size(), stream);
  std::vector<unsigned char> packed(static_cast<std::size_t>(count) * esize);
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(packed.data() + i * esize, strided.data() + i * v.strides[0] * esize, esize);
  }
  return packed;
}

/// Debug checks of the values behind the pointers (see CausalConv1dOptions::debug_check_indices).
/// Skipped under graph capture, where no host copy can be made.
void check_values(Runtime& runtime, const Args& args, const Problem& p, Stream stream) {
  const Op op = p.op;
  const CausalConv1dOptions& options = *args.options;
  const std::int64_t slots = args.conv_state->shape[0];
  if (runtime.capturing(stream)) return;
  if (op == Op::prefill) {
    const TensorView& cu_seqlens = *args.cu_seqlens;
    const auto cu_host = to_host(runtime, cu_seqlens, p.seqs + 1, stream);
    std::int64_t previous = 0;
    for (std::int64_t n = 0; n <= p.seqs; ++n) {
      const std::int64_t value = read_int(cu_host, cu_seqlens.dtype, n);
      if ((n == 0 && value != 0) || value < previous || (n == p.seqs && value != p.tokens)) {
        fail(op, fmt::format("cu_seqlens[{}] = {} (previous {}); accepted: cu_seqlens[0] = 0, "
                             "non-decreasing, cu_seqlens[N] = T = {} (debug check)",
                             n, value, previous, p.tokens));
      }
      previous = value;
    }
  }
  if (p.varlen) {
    const TensorView& query_start_loc = *args.query_start_loc;
    const auto qsl_host = to_host(runtime, query_start_loc, p.seqs + 1, stream);
    std::int64_t previous = 0;
    for (std::int64_t b = 0; b <= p.seqs; ++b) {
      const std::int64_t value = read_int(qsl_host, query_start_loc.dtype, b);
      if (value < previous || value > p.tokens) {
        fail(op, fmt::format("query_start_loc[{}] = {} (previous {}); accepted: from 0, "
                             "non-decreasing, at most T = {} (debug check)",
                             b, value, previous, p.tokens));
      }
      previous = value;
    }
  }
  const TensorView& indices = *args.state_indices;
  const auto idx = to_host(runtime, indices, p.seqs, stream);
  std::vector<std::int64_t> slot_values(static_cast<std::size_t>(p.seqs));
  for (std::int64_t n = 0; n < p.seqs; ++n) {
    slot_values[static_cast<std::size_t>(n)] = read_int(idx, indices.dtype, n);
  }
  ArgChecks(op_name(op))
      .slot_indices("state_indices", slot_values, slots,
                    options.invalid_index == ConvInvalidIndex::nonpositive, "sequences");
  const TensorView* accepted = args.num_accepted_tokens;
  if (op == Op::update && accepted != nullptr && accepted->data != nullptr) {
    const auto acc = to_host(runtime, *accepted, p.seqs, stream);
    const std::int64_t most = p.state_len - p.width + 2;
    for (std::int64_t n = 0; n < p.seqs; ++n) {
      const std::int64_t a = read_int(acc, accepted->dtype, n);
      if (a < 1 || a > most) {
        fail(op, fmt::format("num_accepted_tokens[{}] = {}; accepted: 1..L - W + 2 = {} (the "
                             "history at columns a - 1..a + W - 3 must lie in the pool's L = {} "
                             "columns) (debug check)",
                             n, a, most, p.state_len));
      }
    }
  }
}

/// The parameters every form shares: x and out (their last two dimensions are tokens and
/// channels: [T, D] or the [S, D] of each [B, S, D] row), weights, bias and pool, the state
/// indices, the padding rule and the sizes.
void fill_common_params(const Args& args, const TensorView& x, const TensorView& out,
                        const Problem& p, CausalConv1dParams* k) {
  const int last = x.rank - 1;
  const TensorView& weight = *args.weight;
  const TensorView& bias = *args.bias;
  const TensorView& state = *args.conv_state;
  const TensorView& indices = *args.state_indices;
  k->x = x.data;
  k->out = out.data;
  k->weight = weight.data;
  k->weight_channel_stride = weight.strides[0];
  k->weight_tap_stride = weight.strides[1];
  if (bias.data != nullptr) {
    k->bias = bias.data;
    k->bias_stride = bias.strides[0];
  }
  k->state = state.data;
  k->state_slot_stride = state.strides[0];
  k->state_channel_stride = state.strides[1];
  k->state_col_stride = state.strides[2];
  k->num_slots = state.shape[0];
  k->state_len = state.shape[2];
  k->state_indices = indices.data;
  k->x_token_stride = x.strides[last - 1];
  k->x_channel_stride = x.strides[last];
  k->out_token_stride = out.strides[last - 1];
  k->out_channel_stride = out.strides[last];
  k->index_stride = indices.strides[0];
  k->index_bytes = static_cast<u32>(size_of(indices.dtype));
  k->nonpositive_invalid = args.options->invalid_index == ConvInvalidIndex::nonpositive ? 1 : 0;
  k->num_tokens = p.tokens;
  k->num_seqs = p.seqs;
}

/// kConvWeightBlock where weight is a contiguous [D, W] whose vec x W blocks are whole, aligned
/// 16-byte vectors; kConvBiasVector where bias is contiguous and aligned to vec elements.
u32 vector_flags(const Args& args, const Problem& p, std::int64_t vec) {
  const TensorView& weight = *args.weight;
  const TensorView& bias = *args.bias;
  const auto weight_size = static_cast<std::int64_t>(size_of(p.weight));
  const bool weight_contiguous = weight.strides[0] == p.width && weight.strides[1] == 1;
  const std::int64_t weight_align = align_of(reinterpret_cast<std::uintptr_t>(weight.data));
  u32 flags = 0;
  if (weight_contiguous && weight_align >= 16 && vec * p.width * weight_size % 16 == 0) {
    flags |= kConvWeightBlock;
  }
  if (bias.data != nullptr) {
    const bool bias_contiguous = bias.strides[0] == 1;
    const std::int64_t bias_align = align_of(reinterpret_cast<std::uintptr_t>(bias.data));
    if (bias_contiguous && vec > 1 && vec * weight_size <= 16 && bias_align >= vec * weight_size) {
      flags |= kConvBiasVector;
    }
  }
  return flags;
}

}  // namespace

CausalConv1dParams Family::params(const Args& args, const Problem& p, const Choice& choice, void*) {
  CausalConv1dParams k{};
  if (args.op == Op::update && !args.varlen) {
    const TensorView x = as_rows(*args.x), out = as_rows(*args.out);
    fill_common_params(args, x, out, p, &k);
    k.x_row_stride = x.strides[0];
    k.out_row_stride = out.strides[0];
  } else {
    fill_common_params(args, *args.x, *args.out, p, &k);
  }
  if (args.op == Op::prefill) {
    const TensorView& has_initial = *args.has_initial_state;
    if (has_initial.data != nullptr) {
      k.has_initial_state = static_cast<const unsigned char*>(has_initial.data);
      k.has_initial_stride = has_initial.strides[0];
    }
    const TensorView& cu_seqlens = *args.cu_seqlens;
    k.cu_seqlens = cu_seqlens.data;
    k.cu_stride = cu_seqlens.strides[0];
    k.cu_bytes = static_cast<u32>(size_of(cu_seqlens.dtype));
  } else {
    const TensorView& accepted = *args.num_accepted_tokens;
    if (accepted.data != nullptr) {
      k.num_accepted = accepted.data;
      k.accepted_stride = accepted.strides[0];
      k.accepted_bytes = static_cast<u32>(size_of(accepted.dtype));
    }
    if (args.varlen) {
      const TensorView& query_start_loc = *args.query_start_loc;
      k.query_start_loc = query_start_loc.data;
      k.query_start_stride = query_start_loc.strides[0];
      k.query_start_bytes = static_cast<u32>(size_of(query_start_loc.dtype));
    }
  }
  k.channel_groups = static_cast<u32>(p.dim / choice.vec);
  k.vector_flags = vector_flags(args, p, choice.vec);
  k.num_items = items_of(p, choice.mode, choice.vec, choice.span);
  return k;
}

}  // namespace ops::conv1d

namespace {

using ops::conv1d::Args;
using ops::conv1d::Family;
using ops::conv1d::Op;

void call(const Args& args, Stream stream) {
  const CausalConv1dOptions& options = *args.options;
  const ops::conv1d::Problem problem = Family::check(args);
  ops::run<Family>(args, problem, {options.device, options.runtime}, stream,
                   [&](Runtime& runtime, Stream on) {
                     if (options.debug_check_indices || runtime.settings().debug_checks) {
                       ops::conv1d::check_values(runtime, args, problem, on);
                     }
                   });
}

Plan plan_of(const Args& args, const DeviceLimits& device) {
  return Family::plan(Family::check(args), device).plan;
}

}  // namespace

void causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& bias,
                   const TensorView& conv_state, const TensorView& cu_seqlens,
                   const TensorView& state_indices, const TensorView& has_initial_state,
                   const TensorView& out, const CausalConv1dOptions& options, Stream stream) {
  call({Op::prefill, false, &x, &weight, &bias, &conv_state, &cu_seqlens, nullptr, &state_indices,
        &has_initial_state, nullptr, &out, &options},
       stream);
}

Plan plan_causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& bias,
                        const TensorView& conv_state, const TensorView& cu_seqlens,
                        const TensorView& state_indices, const TensorView& has_initial_state,
                        const TensorView& out, const CausalConv1dOptions& options,
                        const DeviceLimits& device) {
  return plan_of({Op::prefill, false, &x, &weight, &bias, &conv_state, &cu_seqlens, nullptr,
                  &state_indices, &has_initial_state, nullptr, &out, &options},
                 device);
}

void causal_conv1d_update(const TensorView& x, const TensorView& weight, const TensorView& bias,
                          const TensorView& conv_state, const TensorView& state_indices,
                          const TensorView& num_accepted_tokens, const TensorView& out,
                          const CausalConv1dOptions& options, Stream stream) {
  call({Op::update, false, &x, &weight, &bias, &conv_state, nullptr, nullptr, &state_indices,
        nullptr, &num_accepted_tokens, &out, &options},
       stream);
}

Plan plan_causal_conv1d_update(const TensorView& x, const TensorView& weight,
                               const TensorView& bias, const TensorView& conv_state,
                               const TensorView& state_indices,
                               const TensorView& num_accepted_tokens, const TensorView& out,
                               const CausalConv1dOptions& options, const DeviceLimits& device) {
  return plan_of({Op::update, false, &x, &weight, &bias, &conv_state, nullptr, nullptr,
                  &state_indices, nullptr, &num_accepted_tokens, &out, &options},
                 device);
}

void causal_conv1d_update_varlen(const TensorView& x, const TensorView& weight,
                                 const TensorView& bias, const TensorView& conv_state,
                                 const TensorView& query_start_loc, const TensorView& state_indices,
                                 const TensorView& num_accepted_tokens, const TensorView& out,
                                 const CausalConv1dOptions& options, Stream stream) {
  call({Op::update, true, &x, &weight, &bias, &conv_state, nullptr, &query_start_loc,
        &state_indices, nullptr, &num_accepted_tokens, &out, &options},
       stream);
}

Plan plan_causal_conv1d_update_varlen(const TensorView& x, const TensorView& weight,
                                      const TensorView& bias, const TensorView& conv_state,
                                      const TensorView& query_start_loc,
                                      const TensorView& state_indices,
                                      const TensorView& num_accepted_tokens, const TensorView& out,
                                      const CausalConv1dOptions& options,
                                      const DeviceLimits& device) {
  return plan_of({Op::update, true, &x, &weight, &bias, &conv_state, nullptr, &query_start_loc,
                  &state_indices, nullptr, &num_accepted_tokens, &out, &options},
                 device);
}

}  // namespace kjit
