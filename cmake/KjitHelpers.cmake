# Warnings and sanitizers, applied per target (never as global flags).
function(kjit_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wconversion
                         -Wno-sign-conversion -Wno-missing-field-initializers $<$<BOOL:${KJIT_WERROR}>:-Werror>)
  if(KJIT_SANITIZE)
    string(REPLACE ";" "," _san "${KJIT_SANITIZE}")
    target_compile_options(${target} PRIVATE -fsanitize=${_san} -fno-omit-frame-pointer
                           -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${_san})
  endif()
endfunction()

# A layer of the library: an object library whose objects end up in libkjit. `DEPENDS` names
# the lower layers it may include (dependencies point one way).
function(kjit_add_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPENDS" ${ARGN})
  add_library(kjit_${name} OBJECT ${ARG_SOURCES})
  set_target_properties(kjit_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_include_directories(kjit_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    PRIVATE ${PROJECT_SOURCE_DIR}/lib ${KJIT_TEMPLATE_INCLUDE_DIR} ${KJIT_XXHASH_INCLUDE_DIR})
  target_link_libraries(kjit_${name} PRIVATE fmt::fmt-header-only)
  foreach(dep IN LISTS ARG_DEPENDS)
    target_link_libraries(kjit_${name} PRIVATE kjit_${dep})
  endforeach()
  kjit_target_defaults(kjit_${name})
endfunction()

# Fuzz targets (fuzz/). OFF by default; the asan and fuzz presets turn it on. The engine is
# libFuzzer where the compiler provides it (clang), else a small replay + mutation driver
# (fuzz/driver_main.cpp) so that the same targets build and run under g++ too.
option(KJIT_BUILD_FUZZ "Build the fuzz targets under fuzz/" OFF)
set(KJIT_FUZZ_ENGINE "auto" CACHE STRING "Fuzz engine: auto, libfuzzer or replay")
if(KJIT_BUILD_FUZZ)
  # This file is included by the top-level CMakeLists.txt before lib/ and tools/ exist, so
  # fuzz/fuzz.cmake is included once the top-level directory has been processed, when the
  # targets it links (kjit, kjit_internal, kjit_tool_core) are defined. (A deferred call may
  # not add_subdirectory(), hence an included file rather than fuzz/CMakeLists.txt.)
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL include ${CMAKE_SOURCE_DIR}/fuzz/fuzz.cmake)
endif()
