// SPDX-License-Identifier: Apache-2.0
// The op skeleton (ops/op.hpp) as merge_state and gdn_decode use it: check() makes a Problem that
// is the memo key (equal bytes for calls that must share a plan, different bytes for calls that
// must not), plan() returns a typed Choice that agrees with the printed plan, and the workspace
// follows from the Choice.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "ops/gdn_decode/family.hpp"
#include "ops/merge_state/family.hpp"
#include "ops/op.hpp"

namespace kjit {
namespace {

void* fake(std::uintptr_t n) { return reinterpret_cast<void*>((n + 1) << 28); }

template <typename T>
bool same_bytes(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

struct MergeCall {
  TensorView v_a, s_a, v_b, s_b, v_out, s_out;
  MergeStateOptions options;
  ops::merge::Args args() const {
    return {ops::merge::Entry::pair, &v_a, &s_a, &v_b, &s_b, &v_out, &s_out, nullptr, &options};
  }
};

MergeCall merge_call(std::uintptr_t base, std::int64_t tokens = 64) {
  MergeCall c;
  c.v_a = TensorView::contiguous(fake(base), DType::bf16, {tokens, 8, 128});
  c.v_b = TensorView::contiguous(fake(base + 1), DType::bf16, {tokens, 8, 128});
  c.v_out = TensorView::contiguous(fake(base + 2), DType::bf16, {tokens, 8, 128});
  c.s_a = TensorView::contiguous(fake(base + 3), DType::f32, {tokens, 8});
  c.s_b = TensorView::contiguous(fake(base + 4), DType::f32, {tokens, 8});
  c.s_out = TensorView::contiguous(fake(base + 5), DType::f32, {tokens, 8});
  c.options.lse_base = LseBase::e;
  return c;
}

}  // namespace

TEST_CASE("op skeleton: merge_state's Problem is the memo key") {
  using ops::merge::Family;
  const MergeCall a = merge_call(0);
  const MergeCall b = merge_call(16);  // other addresses, same alignment
  CHECK(same_bytes(Family::check(a.args()), Family::check(b.args())));
  MergeCall forced = merge_call(0);
  forced.options.force_mode = "flat";
  const ops::merge::Problem flat = Family::check(forced.args());
  CHECK(flat.forced_mode == ops::merge::ForcedMode::flat);
  CHECK_FALSE(same_bytes(Family::check(a.args()), flat));
  CHECK_FALSE(same_bytes(Family::check(a.args()), Family::check(merge_call(0, 65).args())));
  // A misaligned output is another problem: it changes the vector width.
  MergeCall odd = merge_call(0);
  odd.v_out.data = static_cast<char*>(odd.v_out.data) + 2;
  CHECK_FALSE(same_bytes(Family::check(a.args()), Family::check(odd.args())));
}

TEST_CASE("op skeleton: merge_state's typed Choice agrees with the plan it printed") {
  using ops::merge::Family;
  const DeviceLimits h100 = DeviceLimits::for_arch(Arch{9, 0});
  for (const char* mode : {"", "token_major", "flat"}) {
    MergeCall call = merge_call(0);
    call.options.force_mode = mode;
    const auto planned = Family::plan(Family::check(call.args()), h100);
    REQUIRE(planned.plan.launches.size() == 1);
    const KernelSpec& spec = planned.plan.launches[0].spec;
    CHECK(spec.get_int("vec") == planned.choice.vec);
    CHECK(spec.get_int("chunks") == planned.choice.chunks);
    CHECK(planned.plan.launches[0].shape.block.x ==
          static_cast<std::uint32_t>(planned.choice.lanes));
    CHECK(planned.plan.mode ==
          (planned.choice.mode == MergeGridMode::flat ? "flat" : "token_major"));
    CHECK(Family::workspace_bytes(Family::check(call.args()), planned.choice) == 0);
  }
  // Empty problems launch nothing and need no device.
  CHECK(Family::launches_nothing(Family::check(merge_call(0, 0).args())));
  CHECK_FALSE(Family::launches_nothing(Family::check(merge_call(0).args())));
}

namespace {

struct DecodeCall {
  TensorView qkv, a, b, a_log, dt_bias, state, indices, out;
  GdnDecodeOptions options;
  ops::decode::Args args() const {
    return {
        ops::decode::Form::raw, &qkv, &a, &b, &a_log, &dt_bias, &state, &indices, &out, &options};
  }
};

DecodeCall decode_call(std::int64_t batch, std::int64_t value_heads = 32) {
  DecodeCall c;
  const std::int64_t heads = 16, k = 128, v = 128;
  c.qkv = TensorView::contiguous(fake(0), DType::bf16, {batch, 2 * heads * k + value_heads * v});
  c.a = TensorView::contiguous(fake(1), DType::bf16, {batch, value_heads});
  c.b = TensorView::contiguous(fake(2), DType::bf16, {batch, value_heads});
  c.a_log = TensorView::contiguous(fake(3), DType::f32, {value_heads});
  c.dt_bias = TensorView::contiguous(fake(4), DType::f32, {value_heads});
  c.state = TensorView::contiguous(fake(5), DType::f32, {batch + 8, value_heads, v, k});
  c.indices = TensorView::contiguous(fake(6), DType::i32, {batch});
  c.out = TensorView::contiguous(fake(7), DType::bf16, {batch, value_heads, v});
  return c;
}

}  // namespace

TEST_CASE("op skeleton: gdn_decode's options are values of the Problem, parsed once") {
  using ops::decode::Family;
  DecodeCall call = decode_call(8);
  call.options.force_mode = "split";
  call.options.force_cache_hints = "l2_256/plain";
  const ops::decode::Problem p = Family::check(call.args());
  CHECK(p.forced_mode == ops::decode::Mode::split);
  CHECK(p.hints_forced);
  CHECK(p.load_hint == ops::decode::LoadHint::l2_256);
  CHECK(p.store_hint == ops::decode::StoreHint::plain);
  const auto planned = Family::plan(p, DeviceLimits::for_arch(Arch{9, 0}));
  CHECK(planned.plan.mode == "split");
  CHECK(planned.plan.launches.back().spec.get("load_hint") == "l2_256");
  CHECK(planned.plan.launches.back().spec.get("store_hint") == "plain");
  // A bad string is refused by check(), with the message the planner gave before.
  call.options.force_mode = "sideways";
  CHECK_THROWS_WITH_AS(Family::check(call.args()),
                       doctest::Contains("options.force_mode = 'sideways' is not a grid mode"),
                       InvalidArgument);
  // The scale keys the memo by its bits.
  DecodeCall scaled = decode_call(8);
  scaled.options.scale = 0.5f;
  CHECK(Family::check(scaled.args()).scale() == 0.5f);
  CHECK_FALSE(same_bytes(Family::check(scaled.args()), Family::check(decode_call(8).args())));
}

TEST_CASE("op skeleton: gdn_decode's workspace follows the typed Choice (rows in slot order)") {
  using ops::decode::Family;
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  // 256 rows x 32 value heads x 64 KiB of f32 state: 512 MiB, the planner ranks rows by slot.
  const DecodeCall big = decode_call(256);
  const ops::decode::Problem p = Family::check(big.args());
  const auto ordered = Family::plan(p, h200);
  CHECK(ordered.choice.ordered);
  CHECK(ordered.plan.launches.size() == 2);
  CHECK(Family::workspace_bytes(p, ordered.choice) == 256 * 8);
  CHECK(ordered.plan.launches.back().spec.get_int("bv") == ordered.choice.bv);
  DecodeCall given = decode_call(256);
  given.options.row_order = GdnRowOrder::as_given;
  const ops::decode::Problem q = Family::check(given.args());
  const auto as_given = Family::plan(q, h200);
  CHECK_FALSE(as_given.choice.ordered);
  CHECK(as_given.plan.launches.size() == 1);
  CHECK(Family::workspace_bytes(q, as_given.choice) == 0);
  // The params take the tile count from the Choice, not from the spec's text.
  const GdnDecodeParams params = Family::params(given.args(), q, as_given.choice, nullptr);
  CHECK(params.total_tiles == static_cast<u64>(256 * 32 * (128 / as_given.choice.bv)));
  CHECK(params.order == nullptr);
}

TEST_CASE("op skeleton: two families' problems never share a memo entry") {
  CHECK(ops::family_tag(ops::merge::Family::kName) != ops::family_tag(ops::decode::Family::kName));
  static_assert(ops::OpFamily<ops::merge::Family>);
  static_assert(ops::OpFamily<ops::decode::Family>);
}

}  // namespace kjit
