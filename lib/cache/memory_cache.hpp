// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kjit/runtime.hpp"

namespace kjit::cache {

/// Compiled kernels of this process by key hex. Thread-safe; entries live as long as the
/// cache (kernels are small and a process uses a bounded set of specializations).
class MemoryCache {
 public:
  /// The kernel for `key_hex`, or nullptr.
  std::shared_ptr<const CompiledKernel> find(const std::string& key_hex) const;
  /// Inserts unless present, and returns the kernel now cached for the key: when two threads
  /// compiled the same key, both end up using the first one inserted.
  std::shared_ptr<const CompiledKernel> insert(const std::string& key_hex,
                                               std::shared_ptr<const CompiledKernel> kernel);
  std::size_t size() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledKernel>> kernels_;
};

}  // namespace kjit::cache
