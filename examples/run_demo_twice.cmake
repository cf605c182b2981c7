# Runs the demo as scripts/demo.sh does, twice on an empty cache: the first run must compile
# the real op kernels for sm_90 and sm_100a, the second must find every one in the disk cache.
# cmake -DDEMO=<kjit_demo> -DCACHE_DIR=<scratch cache> -P run_demo_twice.cmake
file(REMOVE_RECURSE ${CACHE_DIR})
foreach(run first second)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env KJIT_CACHE_DIR=${CACHE_DIR} KJIT_LOG=warn
                          ${DEMO}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${run} run:\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the demo's ${run} run failed (${rc})")
  endif()
  if(NOT out MATCHES "cache: ([0-9]+) compiled, ([0-9]+) from the disk cache")
    message(FATAL_ERROR "the demo's ${run} run printed no cache line")
  endif()
  set(compiled ${CMAKE_MATCH_1})
  set(from_disk ${CMAKE_MATCH_2})
  # The real op kernels, for both targets (not test kernels): the prefill as the planner takes it
  # there, the warp-specialized kernel on sm_90 (sm_90a; 4 x 1024 tokens at HV = 32 is 15.5
  # chunks per SM of the sm_90 default's 132, past the H100-class threshold of 15) and the two
  # chunked kernels on sm_100a.
  foreach(target "sm_90:merge_state gdn_decode gdn_prefill_ws"
                 "sm_100a:merge_state gdn_decode gdn_prefill_chunk gdn_prefill_state")
    string(REPLACE ":" ";" parts "${target}")
    list(GET parts 0 arch)
    list(GET parts 1 kernels)
    string(REPLACE " " ";" kernels "${kernels}")
    foreach(kernel ${kernels})
      # (sm_90 or sm_90a: the warp-specialized kernel exists only for sm_90a.)
      if(NOT out MATCHES "\n +${kernel}:[^\n]*@${arch}a?\n +from ")
        message(FATAL_ERROR "the demo's ${run} run shows no ${kernel} kernel for ${arch}")
      endif()
    endforeach()
  endforeach()
  if(run STREQUAL "first" AND (compiled LESS 6 OR NOT from_disk EQUAL 0))
    message(FATAL_ERROR "first run on an empty cache: ${compiled} compiled (expected >= 6: "
                        "3 ops x 2 archs), ${from_disk} from disk (expected 0)")
  endif()
  if(run STREQUAL "second" AND (NOT compiled EQUAL 0 OR NOT from_disk EQUAL first_compiled))
    message(FATAL_ERROR "second run: ${compiled} compiled, ${from_disk} from disk; expected "
                        "every one of the first run's ${first_compiled} kernels from disk")
  endif()
  set(first_compiled ${compiled})
endforeach()
