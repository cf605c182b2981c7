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

# The internal headers a layer may include, as a folder of links: <build>/layer_include/<view>/
# holds one link lib/<layer> per layer named, and nothing else, so that "driver/launch.hpp"
# from a layer that did not declare driver fails to compile.
function(kjit_layer_view view out_var)
  set(_dir ${PROJECT_BINARY_DIR}/layer_include/${view})
  file(REMOVE_RECURSE ${_dir})
  file(MAKE_DIRECTORY ${_dir})
  foreach(layer IN LISTS ARGN)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/lib/${layer} ${_dir}/${layer} SYMBOLIC)
  endforeach()
  set(${out_var} ${_dir} PARENT_SCOPE)
endfunction()

# A layer of the library: an object library whose objects end up in libkjit. `DEPENDS` names
# the lower layers it may include (dependencies point one way); the build enforces it: the
# layer's include path holds only itself and those layers (kjit_layer_view), and the layers
# below the runtime are compiled with KJIT_BELOW_RUNTIME, which the runtime's facade header
# refuses (they share kjit/kernel.hpp with it instead).
function(kjit_add_layer name)
  cmake_parse_arguments(ARG "BELOW_RUNTIME" "" "SOURCES;DEPENDS" ${ARGN})
  add_library(kjit_${name} OBJECT ${ARG_SOURCES})
  set_target_properties(kjit_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  kjit_layer_view(${name} _view ${name} ${ARG_DEPENDS})
  target_include_directories(kjit_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    PRIVATE ${_view} ${KJIT_TEMPLATE_INCLUDE_DIR} ${KJIT_XXHASH_INCLUDE_DIR})
  if(ARG_BELOW_RUNTIME)
    target_compile_definitions(kjit_${name} PRIVATE KJIT_BELOW_RUNTIME=1)
  endif()
  target_link_libraries(kjit_${name} PRIVATE kjit_fmt_headers)
  foreach(dep IN LISTS ARG_DEPENDS)
    target_link_libraries(kjit_${name} PRIVATE kjit_${dep})
  endforeach()
  kjit_target_defaults(kjit_${name})
  # KJIT_UNITY_BUILD: the layer's files compiled in batches (one translation unit each), which
  # parses the standard library, fmt and kjit's headers once per batch instead of once per file.
  set_target_properties(kjit_${name} PROPERTIES UNITY_BUILD ${KJIT_UNITY_BUILD}
                                                UNITY_BUILD_BATCH_SIZE 8)
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
