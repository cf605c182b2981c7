// SPDX-License-Identifier: Apache-2.0
// What a warm start needs to know about NVRTC without loading it. The disk cache's keys
// include the compiler identity (version and PTX banner), which costs a dlopen of libnvrtc
// (~12 ms) and an empty-program compile (~10-40 ms) to learn: most of a fresh process's first
// launch from a warm cache. The memo remembers the identity next to the cache, tied to the
// library file it was measured on (path, size, mtime, inode, device) and to what chose that
// file (the configured library name, the toolkit root and LD_LIBRARY_PATH). A memo whose file
// changed, or that was written for other settings, is not used. A memo that is still used
// after the loader would pick another file (a new library earlier on the system search path)
// yields cubins compiled by the remembered compiler: correct code, just not recompiled; the
// next compile loads NVRTC and rewrites the memo.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kjit::cache {

/// A remembered compiler identity (compile::CompilerIdentity's id and material).
struct CompilerMemo {
  std::string id;
  std::string material;
};

/// The file the memo of `selector` lives in, under the cache root:
/// <root>/v1/compilers/<16 hex of the selector's hash>.memo.
std::string compiler_memo_path(const std::string& root, const std::string& selector);

/// The memo for `selector` when it exists, parses, names `selector` and its library file is
/// unchanged; nullopt otherwise (never throws: a bad memo is only a slower start).
std::optional<CompilerMemo> read_compiler_memo(const std::string& root,
                                               const std::string& selector);

/// Every memo under `root` that parses, whatever selector it was written for and whether its
/// library file still exists, in file-name order. With JIT disabled nothing is compiled, so
/// the identity of whichever compiler filled a (pre-filled, perhaps copied) cache is enough to
/// key its entries; a memo's selector and stamp only decide whether NVRTC must be loaded.
std::vector<CompilerMemo> read_all_compiler_memos(const std::string& root);

/// Writes the memo (temp file + rename, so readers see the old or the new one whole). Best
/// effort: returns false, and logs at debug level, when the file cannot be written or
/// `library_file` cannot be examined.
bool write_compiler_memo(const std::string& root, const std::string& selector,
                         const std::string& library_file, const CompilerMemo& memo);

}  // namespace kjit::cache
