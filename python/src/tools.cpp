// SPDX-License-Identifier: Apache-2.0
// kjit._kjit, tools: plans by shape names, prewarm, source, compile (ext.hpp).
#include "codegen/embedded_templates.hpp"
#include "codegen/families.hpp"
#include "ext.hpp"

namespace kjit::python {

// ---------------------------------------------------------------------------------------------
// Plans by shape names (the `kjit plan` vocabulary), prewarm, source, compile

const OpInfo& find_catalog_op(const std::string& name) {
  for (const OpInfo& op : op_catalog()) {
    if (op.name == name) return op;
  }
  std::string names;
  for (const OpInfo& op : op_catalog()) names += (names.empty() ? "" : ", ") + op.name;
  throw InvalidArgument("op = '" + name + "' is not an op; accepted: " + names);
}

namespace {

/// Shape values completed with the catalog's defaults; a missing size is named the Python way.
ShapeValues complete(const OpInfo& op, const std::map<std::string, std::string>& in) {
  for (const OpParam& param : op.params) {
    if (param.size && in.count(param.name) == 0) {
      std::string sizes;
      for (const OpParam& p : op.params) {
        if (p.size) sizes += (sizes.empty() ? "" : ", ") + p.name;
      }
      throw InvalidArgument(op.name + ": shape value " + param.name + " (" + param.doc +
                            ") is missing; required: " + sizes);
    }
  }
  return complete_shape_values(op, ShapeValues(in.begin(), in.end()), true);
}

}  // namespace

Plan plan_shape(const std::string& op_name, const std::map<std::string, std::string>& values,
                const OptStr& arch, std::optional<int> device) {
  const OpInfo& op = find_catalog_op(op_name);
  const ShapeValues complete_values = complete(op, values);
  if (arch && device) {
    throw InvalidArgument("plan: give arch or device, not both (arch = '" + *arch +
                          "', device = " + std::to_string(*device) + ")");
  }
  DeviceLimits limits;
  if (arch) {
    limits = DeviceLimits::for_name(*arch);
  } else {
    std::string why;
    if (!runtime().driver_available(&why)) {
      throw InvalidArgument("plan: no CUDA device to plan for (" + why +
                            "); accepted: arch='sm_90' (or h100, h200, b200, a100, l40s, "
                            "rtx5090, sm_80 ... sm_120) plans offline");
    }
    limits = runtime().device_limits(device ? *device : runtime().current_device());
  }
  return plan_from_shape(op, complete_values, limits);
}

std::vector<std::string> prewarm_specs(const std::vector<std::string>& specs, int device) {
  std::vector<KernelSpec> parsed;
  std::vector<std::string> names;
  for (const std::string& text : specs) {
    parsed.push_back(KernelSpec::parse(text));
    names.push_back(parsed.back().str());
  }
  nb::gil_scoped_release release;  // compiling may take seconds; other Python threads run
  runtime().prewarm(parsed, device);
  return names;
}

int current_device() { return runtime().current_device(); }

std::string source(const std::string& spec_text, bool templates) {
  const KernelSpec spec = KernelSpec::parse(spec_text);
  std::string out = codegen::stub_source(spec);
  if (!templates) return out;
  // The embedded templates/... headers the stub includes, transitively, each once.
  std::vector<std::string> pending;
  std::set<std::string> shown;
  auto scan = [&](std::string_view text) {
    const std::string_view marker = "#include \"templates/";
    for (std::size_t at = text.find(marker); at != std::string_view::npos;
         at = text.find(marker, at + 1)) {
      const std::size_t begin = at + std::string_view("#include \"").size();
      const std::size_t end = text.find('"', begin);
      if (end != std::string_view::npos) pending.emplace_back(text.substr(begin, end - begin));
    }
  };
  scan(out);
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const std::string name = pending[i];
    if (!shown.insert(name).second) continue;
    const codegen::EmbeddedTemplate* file = codegen::find_template(name);
    if (file == nullptr) continue;
    out += "\n// ===== " + name + " =====\n" + file->contents;
    scan(file->contents);
  }
  return out;
}

nb::dict compile(const std::string& spec_text) {
  const KernelSpec spec = KernelSpec::parse(spec_text);
  KernelSource from = KernelSource::memory;
  std::shared_ptr<const CompiledKernel> kernel;
  {
    nb::gil_scoped_release release;
    kernel = runtime().compiled(spec, &from);
  }
  const char* origins[] = {"memory", "bundle", "disk", "compiled"};
  nb::dict d;
  d["spec"] = kernel->spec.str();
  d["origin"] = origins[static_cast<int>(from)];
  d["key"] = kernel->key;
  d["key_material"] = kernel->key_material;
  d["source"] = kernel->source;
  d["options"] = kernel->options;
  d["log"] = kernel->log;
  d["ptx"] = kernel->ptx;
  d["lowered_name"] = kernel->lowered_name;
  d["cubin"] = nb::bytes(kernel->cubin.data(), kernel->cubin.size());
  nb::dict r;
  r["registers"] = kernel->resources.registers;
  r["static_smem"] = kernel->resources.static_smem;
  r["local_bytes"] = kernel->resources.local_bytes;
  r["spill_store_bytes"] = kernel->resources.spill_store_bytes;
  r["spill_load_bytes"] = kernel->resources.spill_load_bytes;
  r["max_threads"] = kernel->resources.max_threads;
  d["resources"] = r;
  return d;
}

}  // namespace kjit::python
