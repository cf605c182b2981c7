// SPDX-License-Identifier: Apache-2.0
#include "pool.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "cache/entry.hpp"
#include "cache/unique_fd.hpp"
#include "kjit/error.hpp"
#include "support/hash.hpp"

namespace kjit::tool {
namespace {

using cache::UniqueFd;

bool write_all(int fd, const void* data, std::size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t size) {
  char* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// Worker -> parent message: u8 ok, u64 length, payload (ok: 32 hex key + encoded entry;
// failure: the error text).
bool send_result(int fd, bool ok, const std::string& payload) {
  const unsigned char status = ok ? 1 : 0;
  const std::uint64_t length = payload.size();
  return write_all(fd, &status, 1) && write_all(fd, &length, sizeof length) &&
         write_all(fd, payload.data(), payload.size());
}

[[noreturn]] void worker_main(const std::vector<KernelSpec>& specs, int tasks, int results) {
  int code = 0;
  try {
    Runtime runtime(Settings::from_env());
    std::uint32_t index = 0;
    while (read_all(tasks, &index, sizeof index)) {
      bool ok = false;
      std::string payload;
      try {
        const auto kernel = runtime.compiled(specs.at(index));
        support::Hash128 key;
        support::Hash128::parse_hex(kernel->key, &key);
        payload = kernel->key + cache::encode_entry(key, *kernel);
        ok = true;
      } catch (const CompileError& error) {
        payload = error.what();
        if (!error.log().empty()) payload += "\n" + error.log();
      } catch (const std::exception& error) {
        payload = error.what();
      }
      if (!send_result(results, ok, payload)) break;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "kjit: precompile worker failed: %s\n", error.what());
    code = 1;
  }
  // _exit: the parent's atexit handlers and static destructors are not the worker's to run.
  ::_exit(code);
}

struct Worker {
  pid_t pid = -1;
  UniqueFd tasks;    // parent writes spec indices
  UniqueFd results;  // parent reads results
  int busy = -1;     // index of the spec being compiled, -1 when idle
};

void draw_progress(std::size_t done, std::size_t total, std::size_t failed, double seconds) {
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
  std::fprintf(stderr, "\r[%s%s] %zu/%zu specs, %zu failed, %.1f s",
               std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(), done,
               total, failed, seconds);
  std::fflush(stderr);
}

}  // namespace

PoolResult compile_in_pool(const std::vector<KernelSpec>& specs, int jobs, bool progress) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  PoolResult result;
  if (specs.empty()) return result;
  if (jobs < 1) jobs = 1;
  if (static_cast<std::size_t>(jobs) > specs.size()) jobs = static_cast<int>(specs.size());

  // A worker that dies must not kill the parent with SIGPIPE on the next task write.
  struct sigaction ignore {};
  struct sigaction previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &previous);

  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<Worker> workers(static_cast<std::size_t>(jobs));
  for (Worker& worker : workers) {
    int task_pipe[2];
    int result_pipe[2];
    if (::pipe2(task_pipe, O_CLOEXEC) != 0 || ::pipe2(result_pipe, O_CLOEXEC) != 0) {
      throw Error(fmt::format("precompile: pipe failed: {}", std::strerror(errno)));
    }
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(fmt::format("precompile: fork failed: {}", std::strerror(errno)));
    if (pid == 0) {
      ::close(task_pipe[1]);
      ::close(result_pipe[0]);
      // Earlier workers' parent ends were inherited; closing them lets those workers see EOF.
      for (Worker& other : workers) {
        other.tasks.reset();
        other.results.reset();
      }
      worker_main(specs, task_pipe[0], result_pipe[1]);
    }
    ::close(task_pipe[0]);
    ::close(result_pipe[1]);
    worker.pid = pid;
    worker.tasks = UniqueFd(task_pipe[1]);
    worker.results = UniqueFd(result_pipe[0]);
  }

  // By spec index: workers finish in any order, and a bundle written from completion order
  // would differ from run to run.
  std::vector<std::optional<CompiledKernel>> compiled(specs.size());
  std::size_t next = 0;
  std::size_t done = 0;
  auto assign = [&](Worker& worker) {
    if (next >= specs.size()) {
      worker.tasks.reset();  // EOF: the worker exits
      return;
    }
    const auto index = static_cast<std::uint32_t>(next);
    if (write_all(worker.tasks.get(), &index, sizeof index)) {
      worker.busy = static_cast<int>(next++);
    } else {
      worker.tasks.reset();
    }
  };
  for (Worker& worker : workers) assign(worker);
  if (progress) draw_progress(0, specs.size(), 0, 0);

  while (true) {
    std::vector<pollfd> fds;
    std::vector<Worker*> polled;
    for (Worker& worker : workers) {
      if (worker.results) {
        fds.push_back(pollfd{worker.results.get(), POLLIN, 0});
        polled.push_back(&worker);
      }
    }
    if (fds.empty()) break;
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("precompile: poll failed: {}", std::strerror(errno)));
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Worker& worker = *polled[i];
      unsigned char status = 0;
      std::uint64_t length = 0;
      std::string payload;
      bool got = read_all(worker.results.get(), &status, 1) &&
                 read_all(worker.results.get(), &length, sizeof length);
      if (got) {
        payload.resize(static_cast<std::size_t>(length));
        got = read_all(worker.results.get(), payload.data(), payload.size());
      }
      if (!got) {
        // EOF: the worker exited (after its task pipe closed) or died mid-spec.
        if (worker.busy >= 0) {
          result.failures.push_back(
              fmt::format("{}: the worker process died while compiling it",
                          specs[static_cast<std::size_t>(worker.busy)].str()));
          ++done;
        }
        worker.busy = -1;
        worker.results.reset();
        worker.tasks.reset();
        continue;
      }
      const KernelSpec& spec = specs[static_cast<std::size_t>(worker.busy)];
      ++done;
      if (status == 1 && payload.size() >= 32) {
        support::Hash128 key;
        std::string why;
        std::optional<CompiledKernel> kernel;
        if (support::Hash128::parse_hex(std::string_view(payload).substr(0, 32), &key)) {
          kernel = cache::decode_entry(std::string_view(payload).substr(32), key, &why);
        }
        if (kernel) {
          compiled[static_cast<std::size_t>(worker.busy)] = std::move(kernel);
        } else {
          result.failures.push_back(fmt::format("{}: bad result from worker: {}", spec.str(), why));
        }
      } else {
        result.failures.push_back(fmt::format("{}: {}", spec.str(), payload));
      }
      worker.busy = -1;
      assign(worker);
      if (progress) draw_progress(done, specs.size(), result.failures.size(), elapsed());
    }
  }
  if (progress) std::fputc('\n', stderr);
  for (Worker& worker : workers) {
    int status = 0;
    while (::waitpid(worker.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  // Specs never handed out (every worker died) are failures too.
  for (; next < specs.size(); ++next) {
    result.failures.push_back(fmt::format("{}: not compiled: no worker left", specs[next].str()));
  }
  ::sigaction(SIGPIPE, &previous, nullptr);
  for (std::optional<CompiledKernel>& kernel : compiled) {
    if (kernel) result.kernels.push_back(std::move(*kernel));
  }
  result.seconds = elapsed();
  return result;
}

}  // namespace kjit::tool
