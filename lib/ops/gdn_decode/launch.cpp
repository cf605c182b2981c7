// SPDX-License-Identifier: Apache-2.0
// gdn_decode: the kernel parameters of a checked call, the debug index check, and the public
// entry points, which run on the op skeleton (ops/op.hpp).
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/runtime.hpp"
#include "ops/gdn_decode/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit {
namespace ops::decode {
namespace {

/// Debug check: reads the indices back and rejects repeated valid indices and out-of-range
/// ones. Synchronizes `stream`; skipped while it captures (a copy there would break the graph).
void check_indices(Runtime& runtime, const Problem& p, const TensorView& indices, Stream stream) {
  if (runtime.capturing(stream)) return;
  const std::size_t esize = size_of(p.index);
  const std::size_t count = static_cast<std::size_t>((p.batch - 1) * p.index_stride + 1);
  std::vector<unsigned char> host(count * esize);
  runtime.copy_to_host(host.data(), indices.data, host.size(), stream);
  std::vector<std::int64_t> slots(static_cast<std::size_t>(p.batch));
  for (std::int64_t n = 0; n < p.batch; ++n) {
    const std::size_t at = static_cast<std::size_t>(n * p.index_stride) * esize;
    std::int64_t slot = 0;
    if (p.index == DType::i32) {
      std::int32_t v = 0;
      std::memcpy(&v, host.data() + at, 4);
      slot = v;
    } else {
      std::memcpy(&slot, host.data() + at, 8);
    }
    slots[static_cast<std::size_t>(n)] = slot;
  }
  ArgChecks(op_name(p.form))
      .slot_indices("state_indices", slots, p.slots,
                    p.invalid_index == GdnInvalidIndex::nonpositive, "rows");
}

}  // namespace

GdnDecodeParams Family::params(const Args& args, const Problem& p, const Choice& choice,
                               void* workspace) {
  GdnDecodeParams params{};
  fill_step_params(params, args, p);
  params.total_tiles = static_cast<u64>(p.batch * p.value_heads * (p.v / choice.bv));
  // Rows in slot order: the ranking kernel writes B keys here, the step reads them.
  params.order = static_cast<i64*>(workspace);
  return params;
}

}  // namespace ops::decode

namespace {

using ops::decode::Args;
using ops::decode::Family;
using ops::decode::Form;

using ops::decode::ConvFamily;

/// The fused step (options.conv): its own family, the same debug index check (both pools are
/// indexed by state_indices).
void call_fused(const Args& args, Stream stream) {
  const GdnDecodeOptions& options = *args.options;
  const ops::decode::ConvProblem problem = ConvFamily::check(args);
  ops::run<ConvFamily>(args, problem, {options.device, options.runtime}, stream,
                       [&](Runtime& runtime, Stream on) {
                         if (options.debug_check_indices || runtime.settings().debug_checks) {
                           ops::decode::check_indices(runtime, problem.step, *args.indices, on);
                         }
                       });
}

void call(const Args& args, Stream stream) {
  const GdnDecodeOptions& options = *args.options;
  if (options.conv) {
    call_fused(args, stream);
    return;
  }
  const ops::decode::Problem problem = Family::check(args);
  ops::run<Family>(
      args, problem, {options.device, options.runtime}, stream,
      [&](Runtime& runtime, Stream on) {
        if (options.debug_check_indices || runtime.settings().debug_checks) {
          ops::decode::check_indices(runtime, problem, *args.indices, on);
        }
      },
      "options.row_order = as_given needs no scratch memory");
}

Plan plan_of(const Args& args, const DeviceLimits& device) {
  if (args.options->conv) return ConvFamily::plan(ConvFamily::check(args), device).plan;
  return Family::plan(Family::check(args), device).plan;
}

}  // namespace

void gdn_decode(const TensorView& mixed_qkv, const TensorView& a, const TensorView& b,
                const TensorView& a_log, const TensorView& dt_bias, const TensorView& state,
                const TensorView& state_indices, const TensorView& out,
                const GdnDecodeOptions& options, Stream stream) {
  call({Form::raw, &mixed_qkv, &a, &b, &a_log, &dt_bias, &state, &state_indices, &out, &options},
       stream);
}

Plan plan_gdn_decode(const TensorView& mixed_qkv, const TensorView& a, const TensorView& b,
                     const TensorView& a_log, const TensorView& dt_bias, const TensorView& state,
                     const TensorView& state_indices, const TensorView& out,
                     const GdnDecodeOptions& options, const DeviceLimits& device) {
  return plan_of(
      {Form::raw, &mixed_qkv, &a, &b, &a_log, &dt_bias, &state, &state_indices, &out, &options},
      device);
}

void gdn_decode_gated(const TensorView& mixed_qkv, const TensorView& g, const TensorView& beta,
                      const TensorView& state, const TensorView& state_indices,
                      const TensorView& out, const GdnDecodeOptions& options, Stream stream) {
  call({Form::gated, &mixed_qkv, &g, &beta, nullptr, nullptr, &state, &state_indices, &out,
        &options},
       stream);
}

Plan plan_gdn_decode_gated(const TensorView& mixed_qkv, const TensorView& g, const TensorView& beta,
                           const TensorView& state, const TensorView& state_indices,
                           const TensorView& out, const GdnDecodeOptions& options,
                           const DeviceLimits& device) {
  return plan_of({Form::gated, &mixed_qkv, &g, &beta, nullptr, nullptr, &state, &state_indices,
                  &out, &options},
                 device);
}

}  // namespace kjit
