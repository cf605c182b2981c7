// SPDX-License-Identifier: Apache-2.0
// The bundle reader (Bundle::from_bytes, which also decodes every entry inside) on arbitrary
// bytes: anything wrong is a CacheError, never a crash, hang or other exception; an accepted
// bundle's index agrees with its entries.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cache/bundle.hpp"
#include "fuzz_check.hpp"
#include "kjit/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::optional<kjit::cache::Bundle> bundle;
  try {
    bundle.emplace(kjit::cache::Bundle::from_bytes(bytes, "fuzz.kjb"));
  } catch (const kjit::CacheError& error) {
    kjit::fuzz::require(std::string(error.what()).find("fuzz.kjb") != std::string::npos,
                        std::string("bundle error without the bundle's name: ") + error.what());
    return 0;
  }
  for (const kjit::cache::BundleEntry& entry : bundle->entries()) {
    kjit::fuzz::require(entry.kernel != nullptr, "entry without kernel");
    kjit::fuzz::require(bundle->find(entry.spec) != nullptr, "indexed spec not found");
    kjit::fuzz::require(entry.kernel->spec == entry.spec, "record spec differs from its entry");
    kjit::fuzz::require(entry.kernel->key == entry.key, "record key differs from its entry");
    bundle->nearest(entry.spec, 3);
  }
  return 0;
}
