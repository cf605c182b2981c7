// SPDX-License-Identifier: Apache-2.0
// Fallback fuzz engine for compilers without libFuzzer (g++): replays every input of the
// corpus directories or files given, then runs N random mutations of them. No coverage
// feedback, so it finds less than libFuzzer does; its job is that the same targets build and
// run everywhere (CI's g++ ASan+UBSan build), with libFuzzer's command-line shape:
//   kjit_fuzz_<name> [-runs=N] [-seed=S] [-max_len=L] [-max_total_time=T] <dir or file>...
// A crash is a sanitizer report or an uncaught exception (std::terminate); the input that
// caused it is written to ./crash-input (or -artifact_prefix=<p> -> <p>crash-input) first.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
// Provided by the sanitizer runtimes; weak, so that the driver also links without them.
extern "C" __attribute__((weak)) void __sanitizer_set_death_callback(void (*callback)());

namespace {

/// The input being run and where to save it, for the crash handlers (which may only call
/// async-signal-safe functions: open, write, close).
bool g_running = false;
const std::uint8_t* g_input = nullptr;
std::size_t g_input_size = 0;
std::string g_artifact = "crash-input";

void save_input() {
  if (!g_running) return;
  const int fd = ::open(g_artifact.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::size_t done = 0;
  while (done < g_input_size) {
    const ssize_t n = ::write(fd, g_input + done, g_input_size - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  static const char kSaved[] = "replay driver: crashing input saved\n";
  [[maybe_unused]] const ssize_t ignored = ::write(2, kSaved, sizeof(kSaved) - 1);
}

/// SIGABRT (uncaught exception, failed invariant, ASan with abort_on_error) and the
/// sanitizers' death callback (their default exit path does not raise a signal).
void on_abort(int) {
  save_input();
  std::signal(SIGABRT, SIG_DFL);
  std::raise(SIGABRT);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Calls the target on exactly `input` (a copy in its own heap block, so that ASan catches a
/// read one byte past the end, as it does under libFuzzer).
void run_one(const std::string& input) {
  std::vector<std::uint8_t> copy(input.begin(), input.end());
  g_input = copy.data();
  g_input_size = copy.size();
  g_running = true;
  LLVMFuzzerTestOneInput(copy.empty() ? nullptr : copy.data(), copy.size());
  g_running = false;
}

/// Values that tend to sit on boundaries of length fields, counts and limits.
constexpr std::uint64_t kInteresting[] = {0,          1,
                                          2,          16,
                                          31,         32,
                                          64,         127,
                                          128,        255,
                                          256,        1023,
                                          1024,       1025,
                                          32767,      65535,
                                          65536,      0x7fffffff,
                                          0x80000000, 0xffffffff,
                                          1u << 30,   ~std::uint64_t{0}};

/// One random edit: flip a bit, set a byte, overwrite with an interesting integer (1/2/4/8
/// bytes, little-endian), insert or erase a run, duplicate a run, splice from another input,
/// or change a decimal digit (the text formats are full of numbers).
void mutate_once(std::string* s, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  switch (rng() % 9) {
    case 0:
      if (!s->empty()) (*s)[pick(s->size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:
      if (!s->empty()) (*s)[pick(s->size())] = static_cast<char>(rng());
      break;
    case 2: {
      const std::uint64_t value = kInteresting[pick(std::size(kInteresting))];
      const std::size_t width = std::size_t{1} << (rng() % 4);
      if (s->size() < width) break;
      const std::size_t at = pick(s->size() - width + 1);
      for (std::size_t i = 0; i < width; ++i) {
        (*s)[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
      }
      break;
    }
    case 3:
      s->insert(pick(s->size() + 1), std::string(1 + pick(8), static_cast<char>(rng())));
      break;
    case 4:
      if (!s->empty()) {
        const std::size_t at = pick(s->size());
        s->erase(at, 1 + pick(std::min<std::size_t>(16, s->size() - at)));
      }
      break;
    case 5:
      if (!s->empty()) {
        const std::size_t at = pick(s->size());
        const std::string run = s->substr(at, 1 + pick(32));
        s->insert(pick(s->size() + 1), run);
      }
      break;
    case 6:
      if (!corpus.empty()) {
        const std::string& other = corpus[pick(corpus.size())];
        if (!other.empty()) {
          const std::size_t from = pick(other.size());
          s->insert(pick(s->size() + 1), other.substr(from, 1 + pick(64)));
        }
      }
      break;
    case 7:
      if (!s->empty()) s->resize(pick(s->size()));
      break;
    default: {
      std::vector<std::size_t> digits;
      for (std::size_t i = 0; i < s->size(); ++i) {
        if ((*s)[i] >= '0' && (*s)[i] <= '9') digits.push_back(i);
      }
      if (!digits.empty()) (*s)[digits[pick(digits.size())]] = static_cast<char>('0' + rng() % 10);
      break;
    }
  }
}

bool flag(const char* arg, const char* name, long long* value) {
  const std::size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  *value = std::atoll(arg + n);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long long runs = 1000;
  long long seed = 1;
  long long max_len = 1 << 20;
  long long max_time = 0;
  std::vector<std::string> corpus;
  std::signal(SIGABRT, on_abort);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(save_input);
  for (int i = 1; i < argc; ++i) {
    long long ignored = 0;
    if (std::strncmp(argv[i], "-artifact_prefix=", 17) == 0) {
      g_artifact = std::string(argv[i] + 17) + "crash-input";
      continue;
    }
    if (flag(argv[i], "-runs=", &runs) || flag(argv[i], "-seed=", &seed) ||
        flag(argv[i], "-max_len=", &max_len) || flag(argv[i], "-max_total_time=", &max_time)) {
      continue;
    }
    if (argv[i][0] == '-' && flag(argv[i], "-", &ignored)) continue;  // other libFuzzer flags
    const std::filesystem::path path(argv[i]);
    if (std::filesystem::is_directory(path)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());  // deterministic order for a given seed
      for (const auto& file : files) corpus.push_back(read_file(file));
    } else {
      corpus.push_back(read_file(path));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& input : corpus) run_one(input);
  const std::size_t replayed = corpus.size();
  if (corpus.empty()) corpus.emplace_back();
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  long long done = 0;
  for (; done < runs; ++done) {
    if (max_time > 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(max_time)) {
      break;
    }
    std::string input = corpus[rng() % corpus.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) mutate_once(&input, corpus, rng);
    if (input.size() > static_cast<std::size_t>(max_len)) input.resize(max_len);
    run_one(input);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("replay driver: %zu corpus inputs replayed, %lld mutated inputs run, %.1f s\n",
              replayed, done, seconds);
  return 0;
}
