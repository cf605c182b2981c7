// SPDX-License-Identifier: Apache-2.0
// qk_l2norm's registrations: its kernel family (codegen: template, parameters, accepted values)
// and its op catalog entry (kjit plan, manifests, kjit.plan()). Both register from here, so the
// family edits no shared list.
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/families.hpp"
#include "kjit/ops/qk_l2norm.hpp"
#include "kjit/spec.hpp"
#include "kjit/types.hpp"
#include "ops/catalog_entries.hpp"

namespace kjit {
namespace {

// Parameters in the order of the template arguments of kjit::qk_l2norm_kernel
// (templates/qk_l2norm/qk_l2norm.cuh).
codegen::FamilyDecl kernel_family() {
  using codegen::ParamDecl;
  using codegen::ParamKind;
  return codegen::FamilyDecl{
      .name = "qk_l2norm",
      .include = "templates/qk_l2norm/qk_l2norm.cuh",
      .kernel = "kjit::qk_l2norm_kernel",
      .params =
          {
              ParamDecl{.name = "dtype",
                        .kind = ParamKind::dtype,
                        .choices = {"f16", "bf16", "f32"},
                        .doc = "dtype of q, k and the outputs"},
              ParamDecl{.name = "head_dim",
                        .kind = ParamKind::integer,
                        .min = 8,
                        .max = 512,
                        .multiple_of = 8,
                        .doc = "elements per row"},
              ParamDecl{.name = "vec",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 8,
                        .doc = "elements per access (16 bytes when alignment allows)"},
              ParamDecl{.name = "lanes",
                        .kind = ParamKind::choice,
                        .choices = {"1", "2", "4", "8", "16", "32"},
                        .rendered = {"1", "2", "4", "8", "16", "32"},
                        .doc = "lanes per row (a power of two <= 32)"},
          },
      .min_sm = 80,
      .doc = "L2-normalize the [D] rows of q and k: x * rsqrt(sum(x^2) + eps)",
      .typical = {{"vec", "8"}, {"lanes", "16"}},
      .check = [](const KernelSpec& spec) -> std::string {
        const std::int64_t head_dim = spec.get_int("head_dim");
        const std::int64_t vec = spec.get_int("vec");
        if (vec != 1 && vec != 2 && vec != 4 && vec != 8) return "vec must be 1, 2, 4 or 8";
        if (head_dim % vec != 0) return "head_dim must be a multiple of vec";
        const std::int64_t bytes =
            vec * static_cast<std::int64_t>(size_of(parse_dtype(spec.get("dtype"), "dtype")));
        if (bytes > 16) return "vec * sizeof(dtype) must be at most 16 bytes";
        return "";
      },
  };
}

const codegen::FamilyRegistration kKernelFamily(&kernel_family);

Plan plan_entry(const OpInfo&, const ShapeValues& values, const DeviceLimits& device) {
  using namespace catalog_detail;
  const std::int64_t t = get_int(values, "tokens");
  const std::int64_t h = get_int(values, "heads");
  const std::int64_t hk = get_int(values, "k_heads");
  const std::int64_t d = get_int(values, "head_dim");
  const DType dtype = get_dtype(values, "dtype");
  const bool in_place = get_bool(values, "in_place");
  FakeMemory memory;
  const TensorView q = memory.tensor(dtype, {t, h, d});
  const TensorView k = hk > 0 ? memory.tensor(dtype, {t, hk, d}) : FakeMemory::none(dtype, {0});
  const TensorView q_out = in_place ? q : memory.tensor(dtype, {t, h, d});
  const TensorView k_out =
      hk > 0 ? (in_place ? k : memory.tensor(dtype, {t, hk, d})) : FakeMemory::none(dtype, {0});
  return plan_qk_l2norm(q, k, q_out, k_out, QkL2NormOptions{}, device);
}

std::vector<OpInfo> entries() {
  using namespace catalog_detail;
  return {
      {"qk_l2norm",
       {
           size("tokens", "1,7,64,512,4096,32768,262144", "tokens T", at_least(0)),
           size("heads", "", "heads Hq of q"),
           size("head_dim", "64,128,256", "head dim D (multiple of 8, 8..512)",
                multiple_in(8, 8, 512)),
           option("k_heads", "=heads", "heads Hk of k (0: q alone)"),
           option("dtype", "bf16", "dtype of q, k and the outputs"),
           option("in_place", "0", "1: the outputs are the inputs"),
       },
       "L2-normalize every [D] row of q [T, Hq, D] and k [T, Hk, D] in one launch",
       plan_entry},
  };
}

const catalog_detail::CatalogRegistration kCatalog(&entries);

}  // namespace
}  // namespace kjit
