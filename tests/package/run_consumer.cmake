# What a new user does with the README, in a fresh prefix: install, build a project that is
# exactly README.md's CMake and C++ blocks of "Using the library" (no C++ standard, no flags of
# its own), run it, then run the installed tool, also after moving the prefix elsewhere.
# Nothing from the build tree is on the library path: whatever the programs need, they must
# find through the installed files.
#
# cmake -DKJIT_BINARY_DIR=<build> -DREADME=<README.md> -DWORK_DIR=<scratch> -DGENERATOR=<gen>
#       -DWITH_TOOL=<0|1> -P run_consumer.cmake
cmake_minimum_required(VERSION 3.25)

file(REMOVE_RECURSE ${WORK_DIR})
set(_prefix ${WORK_DIR}/prefix)
set(_project ${WORK_DIR}/my_engine)
# The consumer compiles kernels: keep them out of the user's cache.
set(_env ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH KJIT_CACHE_DIR=${WORK_DIR}/cache
         KJIT_LOG=warn)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}:\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()

# The fenced blocks of one language in README's "## Using the library" section, concatenated.
# string(FIND)/SUBSTRING rather than list operations: C++ is full of semicolons.
function(readme_blocks language out_var)
  file(READ ${README} text)
  string(FIND "${text}" "\n## Using the library\n" begin)
  if(begin EQUAL -1)
    message(FATAL_ERROR "${README} has no '## Using the library' section")
  endif()
  string(SUBSTRING "${text}" ${begin} -1 text)
  string(SUBSTRING "${text}" 1 -1 text)
  string(FIND "${text}" "\n## " end)
  if(NOT end EQUAL -1)
    string(SUBSTRING "${text}" 0 ${end} text)
  endif()
  set(fence "\n```${language}\n")
  string(LENGTH "${fence}" fence_length)
  set(blocks "")
  while(TRUE)
    string(FIND "${text}" "${fence}" start)
    if(start EQUAL -1)
      break()
    endif()
    math(EXPR start "${start} + ${fence_length}")
    string(SUBSTRING "${text}" ${start} -1 text)
    string(FIND "${text}" "\n```" stop)
    if(stop EQUAL -1)
      message(FATAL_ERROR "an unclosed ```${language} block in ${README}")
    endif()
    string(SUBSTRING "${text}" 0 ${stop} block)
    string(APPEND blocks "${block}\n\n")
    string(SUBSTRING "${text}" ${stop} -1 text)
  endwhile()
  if(blocks STREQUAL "")
    message(FATAL_ERROR "${README}: no ```${language} block under '## Using the library'")
  endif()
  set(${out_var} "${blocks}" PARENT_SCOPE)
endfunction()

run("install" ${CMAKE_COMMAND} --install ${KJIT_BINARY_DIR} --prefix ${_prefix})

readme_blocks(cmake cmake_lines)
readme_blocks(cpp cpp_lines)
file(WRITE ${_project}/CMakeLists.txt "${cmake_lines}")
file(WRITE ${_project}/main.cpp "${cpp_lines}")

# No CMAKE_CXX_STANDARD and no compiler flags: what the README's lines and kjit::kjit bring
# must be enough.
run("configure the README's project" ${CMAKE_COMMAND} -S ${_project} -B ${_project}/build
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${_prefix})
run("build the README's project" ${CMAKE_COMMAND} --build ${_project}/build)
run("run the README's project" ${_env} ${_project}/build/my_engine)
if(NOT run_output MATCHES "merge_state:")
  message(FATAL_ERROR "the README's program printed no merge_state plan")
endif()

if(NOT WITH_TOOL)
  return()  # configured with KJIT_BUILD_TOOLS=OFF: no bin/kjit to run
endif()
run("installed kjit version" ${_env} ${_prefix}/bin/kjit version)
run("installed kjit plan" ${_env} ${_prefix}/bin/kjit plan merge_state --dtype bf16 --tokens 64
    --heads 256 --head-dim 128 --arch sm_90)
if(NOT run_output MATCHES "mode")
  message(FATAL_ERROR "kjit plan printed no grid mode")
endif()

# A relative run path: the tool still starts once the whole prefix has moved.
file(RENAME ${_prefix} ${WORK_DIR}/moved)
run("kjit version from a moved prefix" ${_env} ${WORK_DIR}/moved/bin/kjit version)
