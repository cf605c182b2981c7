// fmt's compiled part (its out-of-line formatting functions), built once per build tree.
//
// kjit used fmt header-only (FMT_HEADER_ONLY) so that libkjit.so needs no libfmt.so at run
// time (the device machine and the Python wheel have none). But header-only mode compiles
// fmt's implementation (format-inl.h) into every translation unit that formats: ~2.4 s of
// each of ~120 files, in each of the four builds of the test command (main, ASan, TSan, the
// Python wheel) -- about ten minutes of CI. Instead, every target compiles against fmt's
// declarations only and links this one file (the static library kjit_fmt, position-
// independent and hidden, so libkjit.so neither depends on libfmt.so nor exports fmt).
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
// format.h declares these extern when fmt is not header-only.
template FMT_API auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
}  // namespace detail
FMT_END_NAMESPACE
