// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the cache unit and stress tests: private temp directories, random
// kernels, directory listings and stderr capture.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "kjit/runtime.hpp"
#include "kjit/spec.hpp"

namespace kjit::cache::test {

/// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/kjit-cache-test-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    // Tests change modes (0500, 0777); make everything removable again first.
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ignored);
         !ignored && it != std::filesystem::recursive_directory_iterator(); it.increment(ignored)) {
      if (it->is_directory(ignored) && !it->is_symlink(ignored)) {
        ::chmod(it->path().c_str(), 0700);
      }
    }
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string random_bytes(std::mt19937_64& rng, std::size_t size) {
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

/// A kernel with every field set; `scale` multiplies the sizes of the big fields (1: a
/// realistic cubin of ~200 KiB and PTX of ~400 KiB; 0: a few bytes each).
inline CompiledKernel random_kernel(std::mt19937_64& rng, std::size_t scale = 1) {
  CompiledKernel kernel;
  kernel.spec = KernelSpec::parse("probe:heavy=0@sm_90");
  kernel.cubin = random_bytes(rng, 8 + scale * 200 * 1024);
  kernel.ptx = random_bytes(rng, 4 + scale * 400 * 1024);
  kernel.lowered_name = "_ZN4kjit12probe_kernelILb0EEEvPf";
  kernel.source =
      "#include \"templates/probe/probe.cuh\"\ntemplate __global__ void "
      "kjit::probe_kernel<false>(float*);\n" +
      random_bytes(rng, scale * 1024);
  kernel.options = "--gpu-architecture=sm_90\n-std=c++17\n-Xptxas=-v\n";
  kernel.log = "ptxas info    : Used 23 registers\n" + random_bytes(rng, 3 + scale * 2048);
  kernel.key_material = "schema: 1\nspec: probe:heavy=0@sm_90\n" + random_bytes(rng, scale * 512);
  kernel.resources.registers = static_cast<int>(rng() % 256);
  kernel.resources.static_smem = static_cast<std::int64_t>(rng() % 100000);
  kernel.resources.local_bytes = -1;
  kernel.resources.spill_store_bytes = std::int64_t{1} << 40;
  kernel.resources.spill_load_bytes = 12;
  kernel.resources.const_bytes = static_cast<std::int64_t>(rng() % 65536);
  kernel.resources.max_threads = 1024;
  return kernel;
}

/// Field-by-field equality (CompiledKernel has no operator==).
inline bool same_kernel(const CompiledKernel& a, const CompiledKernel& b) {
  const KernelResources& r = a.resources;
  const KernelResources& s = b.resources;
  return a.spec == b.spec && a.cubin == b.cubin && a.ptx == b.ptx &&
         a.lowered_name == b.lowered_name && a.source == b.source && a.options == b.options &&
         a.log == b.log && a.key == b.key && a.key_material == b.key_material &&
         r.registers == s.registers && r.static_smem == s.static_smem &&
         r.local_bytes == s.local_bytes && r.spill_store_bytes == s.spill_store_bytes &&
         r.spill_load_bytes == s.spill_load_bytes && r.const_bytes == s.const_bytes &&
         r.max_threads == s.max_threads;
}

/// Every regular file under `dir`, relative paths, sorted.
inline std::vector<std::string> list_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    if (!it->is_directory()) out.push_back(std::filesystem::relative(it->path(), dir).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Files under `dir` that are neither entries (.kjc) nor lock files (.kjc.lock): leftovers.
inline std::vector<std::string> stray_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& file : list_files(dir)) {
    const bool entry = file.size() > 4 && file.ends_with(".kjc");
    const bool lock = file.ends_with(".kjc.lock");
    // The runtime's compiler memo (cache/compiler_memo.hpp); its temp files stay strays.
    const bool memo = file.ends_with(".memo") && file.find("v1/compilers/") != std::string::npos;
    if (!entry && !lock && !memo) out.push_back(file);
  }
  return out;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline unsigned mode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0xffffffffu;
  return st.st_mode & 07777;
}

/// Redirects fd 2 to a file while alive; text() returns what was written since.
class StderrCapture {
 public:
  StderrCapture() : file_(dir_ / "stderr") {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() { restore(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  std::string text() {
    restore();
    return read_file(file_);
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  TempDir dir_;
  std::string file_;
  int saved_ = -1;
};

}  // namespace kjit::cache::test
