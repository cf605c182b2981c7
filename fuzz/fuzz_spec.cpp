// SPDX-License-Identifier: Apache-2.0
// KernelSpec::parse on arbitrary text. Bad text must be a kjit::Error (any other exception
// or a crash is a bug); an accepted spec must print canonically and re-parse to itself, since
// its text is the cache key's spec field and the bundle index.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "kjit/error.hpp"
#include "kjit/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kjit::KernelSpec spec;
  try {
    spec = kjit::KernelSpec::parse(text);
  } catch (const kjit::Error&) {
    return 0;
  }
  const std::string canonical = spec.str();
  kjit::KernelSpec again;
  try {
    again = kjit::KernelSpec::parse(canonical);
  } catch (const kjit::Error& error) {
    kjit::fuzz::fail("canonical text '" + canonical + "' does not re-parse: " + error.what());
  }
  kjit::fuzz::require(again == spec, "re-parsed spec differs from '" + canonical + "'");
  kjit::fuzz::require(again.str() == canonical, "canonical text is not stable: " + canonical);
  kjit::fuzz::require(kjit::KernelSpecHash{}(again) == kjit::KernelSpecHash{}(spec),
                      "equal specs hash differently: " + canonical);
  return 0;
}
