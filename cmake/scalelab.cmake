# cmake/scalelab.cmake — one helper per target kind (STYLE.md 34), dependency lookup, configure summary.
#   sl_add_lab(01 single_device SOURCES train_step.cpp DRIVER main.cpp)  -> lab01_learner, lab01_ref, programs
#   sl_add_test(test_tensor SOURCES ... LABELS unit cpu common)
#   sl_add_graded_test(lab01 SOURCES ... CHECKS Lab01.X ...)            -> one ctest per check and track

# ---------------------------------------------------------------------------------------------
# OpenBLAS: the OpenMP build, so BLAS inside OpenMP regions does not oversubscribe (DESIGN.md).
function(sl_find_openblas)
  set(_hints /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp)
  set(_inc_hints /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
                 /usr/include/openblas)
  find_library(SL_OPENBLAS_LIB NAMES openblas HINTS ${_hints} ${SL_OPENBLAS_DIR} PATH_SUFFIXES lib lib64)
  find_path(SL_CBLAS_INCLUDE cblas.h HINTS ${_inc_hints} ${SL_OPENBLAS_DIR} PATH_SUFFIXES include)
  if(NOT SL_OPENBLAS_LIB OR NOT SL_CBLAS_INCLUDE)
    message(FATAL_ERROR "OpenBLAS not found.\n  hint: apt-get install libopenblas-openmp-dev "
                        "(or pass -DSL_OPENBLAS_DIR=<prefix with include/cblas.h and lib/libopenblas.so>)")
  endif()
  add_library(sl_blas INTERFACE)
  target_link_libraries(sl_blas INTERFACE ${SL_OPENBLAS_LIB})
  target_include_directories(sl_blas SYSTEM INTERFACE ${SL_CBLAS_INCLUDE})
  add_library(sl::blas ALIAS sl_blas)
  if(SL_OPENBLAS_LIB MATCHES "openmp")
    set(SL_BLAS_BUILD "OpenBLAS (OpenMP)" PARENT_SCOPE)
  else()
    set(SL_BLAS_BUILD "OpenBLAS (${SL_OPENBLAS_LIB})" PARENT_SCOPE)
  endif()
endfunction()

# CLI11 and nlohmann-json are header-only. GPU machines without system packages pass
# -DSL_HEADER_LIBS_DIR=<dir containing CLI/CLI.hpp and nlohmann/json.hpp>.
function(sl_find_header_libs)
  find_path(SL_CLI11_INCLUDE CLI/CLI.hpp HINTS ${SL_HEADER_LIBS_DIR})
  find_path(SL_JSON_INCLUDE nlohmann/json.hpp HINTS ${SL_HEADER_LIBS_DIR})
  if(NOT SL_CLI11_INCLUDE OR NOT SL_JSON_INCLUDE)
    message(FATAL_ERROR "CLI11 or nlohmann-json headers not found.\n  hint: apt-get install libcli11-dev "
                        "nlohmann-json3-dev (or pass -DSL_HEADER_LIBS_DIR=<dir with CLI/ and nlohmann/>)")
  endif()
  add_library(sl_header_libs INTERFACE)
  target_include_directories(sl_header_libs SYSTEM INTERFACE ${SL_CLI11_INCLUDE} ${SL_JSON_INCLUDE})
endfunction()

# CUDA: AUTO builds it where nvcc exists. Architectures default to 80;90 unless given (STYLE.md 35).
macro(sl_setup_cuda)
  set(SL_CUDA_ENABLED OFF)
  if(NOT SL_WITH_CUDA STREQUAL "OFF")
    include(CheckLanguage)
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
      endif()
      enable_language(CUDA)
      find_package(CUDAToolkit REQUIRED)
      set(SL_CUDA_ENABLED ON)
    elseif(SL_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "SL_WITH_CUDA=ON but nvcc was not found.\n  hint: put nvcc on PATH or pass "
                          "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc")
    endif()
  endif()
endmacro()

# ---------------------------------------------------------------------------------------------
# Common compile settings for every scalelab target.
function(sl_target_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
endfunction()

# sl_add_lab(<NN> <name> SOURCES <files relative to the lab folder> [DRIVER main.cpp] [DEPS libs...])
# Builds the lab's TODO functions twice:
#   labNN_learner  from labs/NN_name/<SOURCES>       compile definition SL_TRACK_LABNN=learner
#   labNN_ref      from solutions/NN_name/<SOURCES>  compile definition SL_TRACK_LABNN=ref
# and, with a DRIVER, the lab's program twice: bin/learner/labNN_name and bin/reference/labNN_name.
# Other labs and programs link labNN_ref (DESIGN.md "How the two tracks link").
function(sl_add_lab NN name)
  cmake_parse_arguments(A "" "DRIVER" "SOURCES;DEPS" ${ARGN})
  set(lab_dir ${PROJECT_SOURCE_DIR}/labs/${NN}_${name})
  set(sol_dir ${PROJECT_SOURCE_DIR}/solutions/${NN}_${name})
  foreach(track learner ref)
    if(track STREQUAL "learner")
      set(dir ${lab_dir})
      set(bin_dir ${CMAKE_BINARY_DIR}/bin/learner)
      if(NOT SL_BUILD_LEARNER)
        continue()
      endif()
    else()
      set(dir ${sol_dir})
      set(bin_dir ${CMAKE_BINARY_DIR}/bin/reference)
    endif()
    set(lib lab${NN}_${track})
    list(TRANSFORM A_SOURCES PREPEND ${dir}/ OUTPUT_VARIABLE srcs)
    add_library(${lib} STATIC ${srcs})
    target_include_directories(${lib} PUBLIC ${lab_dir})
    target_compile_definitions(${lib} PUBLIC SL_TRACK_LAB${NN}=${track})
    target_link_libraries(${lib} PUBLIC scalelab_common ${A_DEPS})
    sl_target_defaults(${lib})
    if(A_DRIVER)
      set(exe lab${NN}_${name}_${track})
      add_executable(${exe} ${lab_dir}/${A_DRIVER})
      target_link_libraries(${exe} PRIVATE ${lib})
      set_target_properties(${exe} PROPERTIES OUTPUT_NAME lab${NN}_${name} RUNTIME_OUTPUT_DIRECTORY ${bin_dir})
      sl_target_defaults(${exe})
    endif()
  endforeach()
endfunction()

# sl_add_tool(<name> SOURCES ... [DEPS ...]): a program in bin/ shared by both tracks.
function(sl_add_tool name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE scalelab_common ${A_DEPS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  sl_target_defaults(${name})
endfunction()

# sl_add_test(<name> SOURCES ... [LABELS ...] [DEPS ...] [TIMEOUT s])
# A GoogleTest executable registered as one ctest (unit tests are fast; one process is fine).
function(sl_add_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;LABELS;DEPS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE scalelab_common sl_test_support GTest::gtest ${A_DEPS})
  target_compile_definitions(${name} PRIVATE SL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  sl_target_defaults(${name})
  add_test(NAME ${name} COMMAND ${name} --gtest_color=no)
  set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                       ENVIRONMENT "OMP_NUM_THREADS=1;SL_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

# ---------------------------------------------------------------------------------------------
function(sl_print_summary)
  if(SL_CUDA_ENABLED)
    set(cuda "CUDA on (sm ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    set(cuda "CUDA off (nvcc not found or SL_WITH_CUDA=OFF)")
  endif()
  if(MPI_CXX_FOUND)
    set(mpi "MPI on")
  else()
    set(mpi "MPI off (apt-get install libopenmpi-dev openmpi-bin)")
  endif()
  if(SL_BUILD_LEARNER)
    set(tracks "tracks learner+reference")
  else()
    set(tracks "track reference")
  endif()
  message(STATUS "scalelab: ${cuda} | ${mpi} | BLAS ${SL_BLAS_BUILD} | ${tracks} | ${CMAKE_BUILD_TYPE}")
endfunction()
