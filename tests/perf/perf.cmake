# tests/perf/perf.cmake — registers a lab's graded performance checks (docs/grading.md "Performance
# checks"). Include it from tests/labNN/CMakeLists.txt, then:
#   sl_add_perf_checks(03 test_lab03_perf SOURCES test_lab03_perf.cpp PROGRAM ddp
#                      CHECKS Lab03Perf.ThroughputVsReference TIMEOUT 120 RANKS 2)
# It is sl_add_graded_test (cmake/scalelab.cmake: one ctest per check and track, the same records,
# `scripts/grade NN` runs them) with NP 1, plus what a check that starts the lab's program itself needs:
#   - the harness tests/perf/perf_compare.cpp and where mpiexec and the programs are (compile definitions);
#   - the reference's labNN_<PROGRAM> (and on the learner track the learner's) built with the check;
#     SL_PERF_REFERENCE_DIR, set by scripts/check_mistakes.py, points the check to an unpatched copy;
#   - label perf (scripts/test.sh -LE perf leaves them out) and PROCESSORS <RANKS> (the ranks the check
#     starts; default 2). No RUN_SERIAL: the runs are on the simulated cluster, in virtual time, so what
#     runs beside them changes how long they take, never what they measure.
set(SL_PERF_DIR ${CMAKE_CURRENT_LIST_DIR})

function(sl_add_perf_checks NN name)
  cmake_parse_arguments(A "" "TIMEOUT;PROGRAM;RANKS" "SOURCES;CHECKS;DEPS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 240)
  endif()
  if(NOT A_RANKS)
    set(A_RANKS 2)
  endif()
  sl_add_graded_test(${NN} ${name} SOURCES ${A_SOURCES} ${SL_PERF_DIR}/perf_compare.cpp
                     CHECKS ${A_CHECKS} TIMEOUT ${A_TIMEOUT} DEPS ${A_DEPS})
  set(mpiexec "")
  if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
    set(mpiexec ${MPIEXEC_EXECUTABLE})
  endif()
  foreach(track learner reference)
    set(exe ${name}_${track})
    if(NOT TARGET ${exe})
      continue()
    endif()
    target_include_directories(${exe} PRIVATE ${SL_PERF_DIR})
    target_compile_definitions(${exe} PRIVATE SL_PERF_MPIEXEC="${mpiexec}" SL_PERF_BINARY_DIR="${CMAKE_BINARY_DIR}")
    add_dependencies(${exe} lab${NN}_${A_PROGRAM}_ref)  # sl_add_lab's program target, bin/reference/
    if(track STREQUAL "learner")
      add_dependencies(${exe} lab${NN}_${A_PROGRAM}_learner)
    endif()
    foreach(check ${A_CHECKS})
      string(REGEX REPLACE "^[A-Za-z0-9]+\\." "" test_name "${check}")
      string(REGEX REPLACE "([a-z0-9])([A-Z])" "\\1_\\2" snake "${test_name}")  # as sl_add_graded_test
      string(TOLOWER "${snake}" snake)
      set(test lab${NN}.${snake}.${track})
      set_property(TEST ${test} APPEND PROPERTY LABELS perf)
      set_tests_properties(${test} PROPERTIES PROCESSORS ${A_RANKS})
    endforeach()
  endforeach()
endfunction()
