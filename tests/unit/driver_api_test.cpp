// SPDX-License-Identifier: Apache-2.0
// The driver layer without a GPU: what a user is told when libcuda is missing or is the
// toolkit's stub, error names without a driver, and which faults are sticky.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "driver/driver_api.hpp"
#include "driver/launch.hpp"
#include "kjit/error.hpp"

namespace kjit::driver {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The DriverError driver_api(library) throws, or nullopt-like empty message when it loads.
DriverError load_error(const std::string& library) {
  try {
    (void)driver_api(library);
  } catch (const DriverError& error) {
    return error;
  }
  return DriverError("");
}

TEST_CASE("driver: a missing library says which, why, and how to point at another") {
  const std::string library = "libkjit-no-such-cuda-driver.so.1";
  const DriverError error = load_error(library);
  const std::string message = error.what();
  CAPTURE(message);
  CHECK(contains(message, library));
  CHECK(contains(message, "cannot open shared object file"));  // dlerror()'s text
  CHECK(contains(message, "KJIT_CUDA_DRIVER_LIBRARY"));
  CHECK(error.result() == 0);

  // The outcome is cached: the same error again, not a second dlopen with another story.
  CHECK(std::string(load_error(library).what()) == message);

  std::string why;
  CHECK_FALSE(driver_loadable(library, &why));
  CHECK(why == message);
  CHECK_FALSE(driver_loadable(library, nullptr));
}

TEST_CASE("driver: the default library, where this machine has no driver") {
  std::string why;
  if (driver_loadable("", &why)) {
    MESSAGE("a CUDA driver is installed here; the no-driver message is not observable");
    return;
  }
  CAPTURE(why);
  CHECK(contains(why, "libcuda.so.1"));
  // Either it is absent (the loader's words) or it loaded and said why it cannot be used.
  CHECK((contains(why, "KJIT_CUDA_DRIVER_LIBRARY") || contains(why, "CUDA_ERROR_")));
}

TEST_CASE("driver: the toolkit's link stub is named as such") {
  const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!std::filesystem::exists(stub)) {
    MESSAGE("no CUDA toolkit stub at " << stub);
    return;
  }
  const DriverError error = load_error(stub);
  const std::string message = error.what();
  CAPTURE(message);
  CHECK(contains(message, stub));
  CHECK(contains(message, "CUDA_ERROR_STUB_LIBRARY"));
  CHECK(contains(message, "stub"));
  CHECK(contains(message, "KJIT_CUDA_DRIVER_LIBRARY"));
  CHECK(error.result() == CUDA_ERROR_STUB_LIBRARY);
  CHECK_FALSE(error.call().empty());
}

TEST_CASE("driver: describe names results with or without a driver") {
  CHECK(contains(describe(CUDA_ERROR_ILLEGAL_ADDRESS), "CUDA_ERROR_ILLEGAL_ADDRESS"));
  CHECK(contains(describe(CUDA_ERROR_NO_DEVICE), "CUDA_ERROR_NO_DEVICE"));
  CHECK(contains(describe(CUDA_ERROR_STUB_LIBRARY), "CUDA_ERROR_STUB_LIBRARY"));
  CHECK(contains(describe(CUDA_SUCCESS), "CUDA_SUCCESS"));
  CHECK(contains(describe(static_cast<CUresult>(1023)), "1023"));
}

TEST_CASE("driver: check throws DriverError naming the call and the result") {
  CHECK_NOTHROW(check(CUDA_SUCCESS, "cuInit"));
  try {
    check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
    FAIL("check did not throw");
  } catch (const DriverError& error) {
    const std::string message = error.what();
    CHECK(contains(message, "cuMemAlloc"));
    CHECK(contains(message, "CUDA_ERROR_OUT_OF_MEMORY"));
    CHECK(error.result() == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(error.call() == "cuMemAlloc");
  }
}

TEST_CASE("driver: sticky faults are recognised") {
  for (CUresult sticky :
       {CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_ILLEGAL_INSTRUCTION,
        CUDA_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_HARDWARE_STACK_ERROR, CUDA_ERROR_ASSERT,
        CUDA_ERROR_INVALID_PC, CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_LAUNCH_TIMEOUT,
        CUDA_ERROR_ECC_UNCORRECTABLE, CUDA_ERROR_CONTAINED}) {
    CAPTURE(describe(sticky));
    CHECK(is_sticky(sticky));
  }
  // Errors of one call that leave the context usable.
  for (CUresult recoverable :
       {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_READY,
        CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_NOT_FOUND,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_NO_DEVICE}) {
    CAPTURE(describe(recoverable));
    CHECK_FALSE(is_sticky(recoverable));
  }
}

TEST_CASE("driver: an empty LoadedLibrary needs no driver") {
  LoadedLibrary empty;
  CHECK_FALSE(empty);
  LoadedLibrary moved(std::move(empty));
  CHECK_FALSE(moved);
  CHECK_THROWS_AS(LoadedLibrary(std::string_view{}), DriverError);
}

}  // namespace
}  // namespace kjit::driver
