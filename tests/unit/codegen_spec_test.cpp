// SPDX-License-Identifier: Apache-2.0
// KernelSpec text, its checks, the stub and name expression, and the embedded template table.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "codegen/embedded_templates.hpp"
#include "codegen/families.hpp"
#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "support/hash.hpp"

namespace kjit::codegen {
namespace {

// The message of the InvalidArgument that parsing `text` throws; fails the test if none is.
std::string parse_error(const std::string& text) {
  try {
    (void)KernelSpec::parse(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  FAIL("spec '", text, "' was accepted");
  return {};
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("probe specs round-trip through their text") {
  for (const char* text : {"probe:heavy=0@sm_80", "probe:heavy=1@sm_90", "probe:heavy=1@sm_90a",
                           "probe:heavy=0@sm_100f"}) {
    CAPTURE(text);
    const KernelSpec spec = KernelSpec::parse(text);
    CHECK(spec.str() == text);
    CHECK(KernelSpec::parse(spec.str()) == spec);
    CHECK(KernelSpecHash{}(KernelSpec::parse(text)) == KernelSpecHash{}(spec));
  }
  // Other spellings parse to the canonical text.
  const KernelSpec spelled = KernelSpec::parse("probe:heavy=true@9.0");
  CHECK(spelled.str() == "probe:heavy=1@sm_90");
  CHECK(spelled == KernelSpec::make("probe", {{"heavy", "1"}}, Arch{9, 0}));
  CHECK(spelled.get("heavy") == "1");
  CHECK(spelled.get_int("heavy") == 1);
  CHECK(spelled != KernelSpec::parse("probe:heavy=0@sm_90"));
  CHECK(spelled != KernelSpec::parse("probe:heavy=1@sm_90a"));
}

TEST_CASE("specs of every declared family round-trip") {
  for (const FamilyDecl& family : families()) {
    if (family.params.empty()) continue;
    // Declared in reverse, to check that make() restores the declared order. First the largest
    // value of every parameter; where the family's joint check refuses that combination, the
    // family's typical values and first choices instead.
    const auto params_for = [&](bool extreme) {
      std::vector<std::pair<std::string, std::string>> params;
      for (auto decl = family.params.rbegin(); decl != family.params.rend(); ++decl) {
        std::string value;
        switch (decl->kind) {
          case ParamKind::dtype:
            value = decl->choices.empty() ? "f32" : std::string(decl->choices.front());
            break;
          case ParamKind::integer: {
            const std::int64_t step = std::max<std::int64_t>(decl->multiple_of, 1);
            value = std::to_string(((decl->max / step) * step));
            break;
          }
          case ParamKind::choice:
            value = std::string(extreme ? decl->choices.back() : decl->choices.front());
            break;
          case ParamKind::boolean:
            value = "1";
            break;
        }
        if (const auto typical = family.typical_value(decl->name); typical && !extreme) {
          value = std::string(*typical);
        }
        params.emplace_back(std::string(decl->name), value);
      }
      return params;
    };
    const Arch arch{std::max(family.min_sm, 80) / 10, std::max(family.min_sm, 80) % 10};
    KernelSpec spec;
    try {
      spec = KernelSpec::make(family.name, params_for(true), arch);
    } catch (const InvalidArgument& e) {
      INFO(e.what());
      const bool has_joint_check = family.check != nullptr;
      REQUIRE(has_joint_check);  // only a joint check may refuse per-parameter values
      spec = KernelSpec::make(family.name, params_for(false), arch);
    }
    CAPTURE(spec.str());
    // Declared order, less the parameters left out at their omitted default.
    std::vector<std::string_view> expected;
    for (const ParamDecl& decl : family.params) {
      if (decl.omitted_default.empty() || spec.has(decl.name)) expected.push_back(decl.name);
    }
    REQUIRE(spec.params.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) CHECK(spec.params[i].first == expected[i]);
    CHECK(KernelSpec::parse(spec.str()) == spec);
  }
}

TEST_CASE("a family's joint check refuses what its template's static_asserts would") {
  const std::string base =
      "gdn_decode:qkv=bf16,gate=bf16,a_log=f32,dt_bias=bf16,state=f32,out=bf16,index=i32,k=128,"
      "v=128,{},load_hint=stream,store_hint=stream,gated=0,l2norm=1,invalid=negative,{}@{}";
  const auto spec = [&](std::string_view tile, std::string_view arch,
                        std::string_view ordered = "ordered=0") {
    return fmt::format(fmt::runtime(base), tile, ordered, arch);
  };
  // What the planner emits parses.
  CHECK_NOTHROW(KernelSpec::parse(
      spec("bv=4,warps=1,vec_bytes=16,mode=flat,stages=0,min_blocks=0", "sm_90")));
  CHECK_NOTHROW(KernelSpec::parse(
      spec("bv=16,warps=4,vec_bytes=16,mode=bulk,stages=4,min_blocks=0", "sm_90")));
  CHECK(contains(
      parse_error(spec("bv=4,warps=1,vec_bytes=16,mode=flat,stages=8,min_blocks=0", "sm_90")),
      "stages = 8 belongs to mode=bulk alone"));
  CHECK(contains(
      parse_error(spec("bv=16,warps=4,vec_bytes=16,mode=bulk,stages=0,min_blocks=0", "sm_90")),
      "mode=bulk needs stages 1..8"));
  CHECK(contains(
      parse_error(spec("bv=16,warps=4,vec_bytes=16,mode=bulk,stages=2,min_blocks=0", "sm_80")),
      "mode=bulk needs sm_90"));
  // f32 state in 16-byte vectors: 32 lanes per row of 128, one row per warp; 3 warps do not
  // divide a tile of 4 rows, and 12 rows do not divide V = 128.
  CHECK(contains(
      parse_error(spec("bv=4,warps=3,vec_bytes=16,mode=flat,stages=0,min_blocks=0", "sm_90")),
      "bv = 4 is not a multiple of warps x rows per warp = 3 x 1"));
  CHECK(contains(
      parse_error(spec("bv=12,warps=1,vec_bytes=16,mode=flat,stages=0,min_blocks=0", "sm_90")),
      "bv = 12 does not divide v = 128"));
  // Rows in slot order: the one-tile-per-block modes only.
  CHECK_NOTHROW(KernelSpec::parse(
      spec("bv=8,warps=1,vec_bytes=16,mode=folded,stages=0,min_blocks=0", "sm_90", "ordered=1")));
  CHECK(contains(parse_error(spec("bv=16,warps=4,vec_bytes=16,mode=persistent,stages=0,min_"
                                  "blocks=0",
                                  "sm_90", "ordered=1")),
                 "ordered=1 (rows in slot order) is for the one-tile-per-block modes "
                 "(mode=persistent)"));
  // Staged loads: one tile per block, 16-byte vectors, cp.async (sm_80 on).
  const auto staged = [&](std::string_view tile, std::string_view arch) {
    std::string text = spec(tile, arch);
    text.replace(text.find("load_hint=stream"), 16, "load_hint=staged");
    return text;
  };
  CHECK_NOTHROW(KernelSpec::parse(
      staged("bv=8,warps=1,vec_bytes=16,mode=split,stages=0,min_blocks=32", "sm_80")));
  CHECK(contains(
      parse_error(staged("bv=16,warps=4,vec_bytes=16,mode=bulk,stages=2,min_blocks=0", "sm_90")),
      "load_hint=staged is for the one-tile-per-block modes with 16-byte vectors (mode=bulk"));
  CHECK(contains(
      parse_error(staged("bv=8,warps=1,vec_bytes=8,mode=flat,stages=0,min_blocks=0", "sm_90")),
      "vec_bytes=8"));
}

TEST_CASE("bad specs name what is wrong") {
  const std::string unknown_family = parse_error("nosuch:heavy=1@sm_90");
  CHECK(contains(unknown_family, "nosuch"));
  CHECK(contains(unknown_family, "probe"));  // the known families are listed

  const std::string unknown_param = parse_error("probe:heavy=1,light=2@sm_90");
  CHECK(contains(unknown_param, "'light'"));
  CHECK(contains(unknown_param, "heavy"));  // the parameters it does have

  CHECK(contains(parse_error("probe:@sm_90"), "'heavy'"));
  CHECK(contains(parse_error("probe:heavy=1,heavy=0@sm_90"), "'heavy'"));

  const std::string bad_value = parse_error("probe:heavy=2@sm_90");
  CHECK(contains(bad_value, "'heavy'"));
  CHECK(contains(bad_value, "2"));
  CHECK(contains(bad_value, "0, 1"));

  CHECK(contains(parse_error("probe heavy=1"), "malformed"));
  const std::string malformed = parse_error("probe:heavy=1");
  CHECK(contains(malformed, "malformed"));
  {
    // The example the message gives is a spec a user can paste (issue 20: it was not).
    const std::size_t start = malformed.find("e.g. ");
    REQUIRE(start != std::string::npos);
    const std::string example =
        malformed.substr(start + 5, malformed.find(' ', start + 5) - (start + 5));
    CAPTURE(example);
    CHECK_NOTHROW(KernelSpec::parse(example));
  }
  CHECK(contains(parse_error("probe:heavy@sm_90"), "'heavy'"));
  CHECK(contains(parse_error("probe:=1@sm_90"), "key=value"));

  CHECK(contains(parse_error("probe:heavy=1@sm_xx"), "sm_xx"));
  CHECK(contains(parse_error("probe:heavy=1@"), "arch"));
  // Below the family's minimum compute capability.
  const std::string too_old = parse_error("probe:heavy=1@sm_60");
  CHECK(contains(too_old, "sm_60"));
  CHECK(contains(too_old, "sm_70"));

  CHECK_THROWS_AS(KernelSpec::parse("probe:heavy=1@sm_90").get("light"), InvalidArgument);
}

TEST_CASE("the stub is one include plus comments, and the name expression instantiates") {
  const KernelSpec spec = KernelSpec::parse("probe:heavy=1@sm_90");
  const std::string stub = stub_source(spec);
  CHECK(contains(stub, "#include \"templates/probe/probe.cuh\"\n"));
  CHECK(contains(stub, spec.str()));
  CHECK(name_expression(spec) == "&kjit::probe_kernel<true>");
  CHECK(name_expression(KernelSpec::parse("probe:heavy=0@sm_90")) == "&kjit::probe_kernel<false>");
  // Only comments besides the include: no kernel text is assembled from strings.
  std::size_t start = 0;
  while (start < stub.size()) {
    std::size_t end = stub.find('\n', start);
    if (end == std::string::npos) end = stub.size();
    const std::string line = stub.substr(start, end - start);
    CHECK_MESSAGE((line.empty() || line.starts_with("//") || line.starts_with("#include")), line);
    start = end + 1;
  }
  // The arch does not change the stub; the parameters do.
  CHECK(stub_source(KernelSpec::parse("probe:heavy=1@sm_80")) != stub);
  CHECK(device_type_name(DType::bf16) == "__nv_bfloat16");
  CHECK(device_type_name(DType::f16) == "__half");
}

TEST_CASE("a parameter declared with an omitted default leaves V-major specs as they were") {
  // gdn_prefill_state's state_layout (the last template parameter, default vk).
  const std::string v_major =
      "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=64,ckpt=0"
      "@sm_90";
  const KernelSpec plain = KernelSpec::parse(v_major);
  const KernelSpec spelled = KernelSpec::parse(
      "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=64,ckpt=0,"
      "state_layout=vk@sm_90");
  CHECK(plain.str() == v_major);
  CHECK(spelled == plain);  // given at its default: left out
  CHECK_FALSE(plain.has("state_layout"));
  CHECK(plain.get_or("state_layout", "vk") == "vk");
  CHECK_THROWS_AS(plain.get("state_layout"), InvalidArgument);
  CHECK(stub_source(spelled) == stub_source(plain));
  CHECK(name_expression(plain) ==
        "&kjit::gdn_prefill_state_kernel<__nv_bfloat16, float, __nv_bfloat16, int, int, 128, "
        "128, 64, false>");
  const KernelSpec k_major = KernelSpec::parse(
      "gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=64,ckpt=0,"
      "state_layout=kv@sm_90");
  CHECK(k_major.str() == v_major.substr(0, v_major.find('@')) + ",state_layout=kv@sm_90");
  CHECK(k_major.get("state_layout") == "kv");
  CHECK(name_expression(k_major) ==
        "&kjit::gdn_prefill_state_kernel<__nv_bfloat16, float, __nv_bfloat16, int, int, 128, "
        "128, 64, false, 1>");
  CHECK(KernelSpec::parse(k_major.str()) == k_major);
  CHECK(contains(parse_error("gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,"
                             "v=128,bv=64,ckpt=0,state_layout=xy@sm_90"),
                 "'state_layout' = 'xy' is not accepted; accepted: vk, kv"));
}

TEST_CASE("the embedded template table") {
  const auto table = embedded_templates();
  REQUIRE(!table.empty());
  CHECK(std::is_sorted(table.begin(), table.end(),
                       [](const EmbeddedTemplate& a, const EmbeddedTemplate& b) {
                         return std::strcmp(a.include_name, b.include_name) < 0;
                       }));
  for (const char* name :
       {"templates/probe/probe.cuh", "templates/probe/params.h", "templates/common/types.h"}) {
    CAPTURE(name);
    const EmbeddedTemplate* file = find_template(name);
    REQUIRE(file != nullptr);
    CHECK(std::strlen(file->contents) > 0);
  }
  CHECK(contains(find_template("templates/probe/probe.cuh")->contents, "probe_kernel"));
  CHECK(find_template("templates/nope.cuh") == nullptr);
  CHECK(find_template("probe.cuh") == nullptr);

  for (const FamilyDecl& family : families()) {
    if (find_template(family.include) == nullptr) {
      // A declared family whose template has not landed must not claim parameters yet.
      CHECK_MESSAGE(family.params.empty(), family.name, " declares parameters but ", family.include,
                    " is not embedded");
      MESSAGE("family ", family.name, ": ", family.include, " not embedded yet");
    }
  }
}

TEST_CASE("template_set_digest is 32 hex, stable, and covers every file") {
  const std::string& digest = template_set_digest();
  CHECK(digest.size() == 32);
  CHECK(digest.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(template_set_digest() == digest);
  // Recomputed from the table: a change to any name or byte changes the digest.
  std::string material;
  for (const EmbeddedTemplate& file : embedded_templates()) {
    for (const char* field : {file.include_name, file.contents}) {
      material += std::to_string(std::strlen(field)) + ":" + field;
    }
  }
  CHECK(support::xxh3_128(material).hex() == digest);
  CHECK(support::xxh3_128(material + " ").hex() != digest);
}

}  // namespace kjit::codegen
