// SPDX-License-Identifier: Apache-2.0
#include "cache/memory_cache.hpp"

#include <utility>

namespace kjit::cache {

std::shared_ptr<const CompiledKernel> MemoryCache::find(const std::string& key_hex) const {
  std::lock_guard<std::mutex> guard(mutex_);
  const auto it = kernels_.find(key_hex);
  return it == kernels_.end() ? nullptr : it->second;
}

std::shared_ptr<const CompiledKernel> MemoryCache::insert(
    const std::string& key_hex, std::shared_ptr<const CompiledKernel> kernel) {
  std::lock_guard<std::mutex> guard(mutex_);
  return kernels_.try_emplace(key_hex, std::move(kernel)).first->second;
}

std::size_t MemoryCache::size() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return kernels_.size();
}

void MemoryCache::clear() {
  std::lock_guard<std::mutex> guard(mutex_);
  kernels_.clear();
}

}  // namespace kjit::cache
