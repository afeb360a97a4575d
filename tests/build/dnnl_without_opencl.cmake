# dnnl_without_opencl.cmake — configure the project in a scratch folder with OpenCL made unusable and
# check what SL_WITH_DNNL=${MODE} does (tests/build/CMakeLists.txt). Run as
#   cmake -DSRC=<repo> -DBIN=<scratch dir> -DMODE=AUTO|ON -DGENERATOR=Ninja -P dnnl_without_opencl.cmake
# AUTO: the configure succeeds and the summary says "oneDNN off (its CMake config needs OpenCL ...;
#       apt-get install ocl-icd-opencl-dev)". ON: the configure fails, naming ocl-icd-opencl-dev.
# Before the fix, AUTO stopped the whole configure inside oneDNN's own dnnl-config.cmake.
find_file(dnnl_config dnnl-config.cmake
          PATHS /usr/lib/x86_64-linux-gnu/cmake/dnnl /usr/lib/aarch64-linux-gnu/cmake/dnnl /usr/lib/cmake/dnnl
          NO_DEFAULT_PATH)
if(NOT dnnl_config)
  message("SKIPPED: no oneDNN CMake config installed (libdnnl-dev), so there is nothing for OpenCL to break")
  return()
endif()
file(REMOVE_RECURSE ${BIN})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -G ${GENERATOR} -DSL_WITH_CUDA=OFF -DSL_BUILD_TESTS=OFF
                        -DSL_WITH_DNNL=${MODE} -DOpenCL_INCLUDE_DIR=/nonexistent -DOpenCL_LIBRARY=/nonexistent
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE ${BIN})
set(all "${out}${err}")
if(MODE STREQUAL "AUTO")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "SL_WITH_DNNL=AUTO with OpenCL unusable: the configure failed (exit ${rc}); AUTO must "
                        "fall back to oneDNN off:\n${all}")
  endif()
  string(REGEX MATCH "oneDNN off \\(its CMake config needs OpenCL[^|]*apt-get install ocl-icd-opencl-dev\\)" said "${all}")
  if(NOT said)
    message(FATAL_ERROR "SL_WITH_DNNL=AUTO with OpenCL unusable: the summary does not say 'oneDNN off (its CMake "
                        "config needs OpenCL ...; apt-get install ocl-icd-opencl-dev)':\n${all}")
  endif()
  message("passed: configure succeeded; summary: ${said}")
else()
  if(rc EQUAL 0)
    message(FATAL_ERROR "SL_WITH_DNNL=ON with OpenCL unusable: the configure succeeded; ON must fail:\n${all}")
  endif()
  if(NOT all MATCHES "ocl-icd-opencl-dev")
    message(FATAL_ERROR "SL_WITH_DNNL=ON with OpenCL unusable: the error does not name ocl-icd-opencl-dev:\n${all}")
  endif()
  message("passed: configure failed with a hint naming ocl-icd-opencl-dev")
endif()
