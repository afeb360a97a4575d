# cmake/scalelab.cmake — one helper per target kind (docs/style.md 34), dependency lookup, configure summary.
#   sl_read_lab_manifests() / sl_add_lab_from_manifest(03)   labs/NN_name/lab.json -> the lab (sl_add_lab below)
#   sl_add_lab(03 ddp SOURCES ddp.cpp GIVEN grad_sync.cpp DRIVER main.cpp)  -> lab03_learner, lab03_ref, programs
#   sl_add_test(test_tensor SOURCES ... LABELS unit cpu common)
#   sl_add_graded_test(01 test_lab01 SOURCES ... CHECKS Lab01.X ...)    -> one ctest per check and track

# ---------------------------------------------------------------------------------------------
# OpenBLAS: the OpenMP build, so BLAS inside OpenMP regions does not oversubscribe (docs/design.md).
# -DSL_OPENBLAS_DIR=<prefix with include/cblas.h and lib/libopenblas.so> (e.g. deps/, filled by
# scripts/pack_gpu_deps.sh for GPU machines without system packages) is searched ALONE: a given prefix
# must never lose to a system OpenBLAS found first.
function(sl_find_openblas)
  if(SL_OPENBLAS_DIR)
    find_library(SL_OPENBLAS_LIB NAMES openblas PATHS ${SL_OPENBLAS_DIR} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
    find_path(SL_CBLAS_INCLUDE cblas.h PATHS ${SL_OPENBLAS_DIR} PATH_SUFFIXES include NO_DEFAULT_PATH)
  else()
    set(_hints /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp)
    set(_inc_hints /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
                   /usr/include/openblas)
    find_library(SL_OPENBLAS_LIB NAMES openblas HINTS ${_hints} PATH_SUFFIXES lib lib64)
    find_path(SL_CBLAS_INCLUDE cblas.h HINTS ${_inc_hints} PATH_SUFFIXES include)
  endif()
  if(NOT SL_OPENBLAS_LIB OR NOT SL_CBLAS_INCLUDE)
    message(FATAL_ERROR "OpenBLAS not found (SL_OPENBLAS_DIR='${SL_OPENBLAS_DIR}').\n  hint: apt-get install libopenblas-openmp-dev "
                        "(or pass -DSL_OPENBLAS_DIR=<prefix with include/cblas.h and lib/libopenblas.so>; "
                        "GPU machines: scripts/pack_gpu_deps.sh fills deps/)")
  endif()
  add_library(sl_blas INTERFACE)
  target_link_libraries(sl_blas INTERFACE ${SL_OPENBLAS_LIB})
  target_include_directories(sl_blas SYSTEM INTERFACE ${SL_CBLAS_INCLUDE})
  add_library(sl::blas ALIAS sl_blas)
  # The OpenMP build: Debian's path says so; a copied library (deps/lib) says so by needing libgomp
  # (its NEEDED names sit in .dynstr near the start of the file, so this read stops early).
  set(_openmp OFF)
  if(SL_OPENBLAS_LIB MATCHES "openmp")
    set(_openmp ON)
  else()
    file(STRINGS ${SL_OPENBLAS_LIB} _gomp LIMIT_COUNT 1 REGEX "libgomp\\.so")
    if(_gomp)
      set(_openmp ON)
    endif()
  endif()
  if(_openmp)
    set(SL_BLAS_BUILD "OpenBLAS (OpenMP)" PARENT_SCOPE)
  else()
    set(SL_BLAS_BUILD "OpenBLAS (${SL_OPENBLAS_LIB})" PARENT_SCOPE)
  endif()
endfunction()

# oneDNN (optional): the CPU bf16-compute matmuls on its native bf16 GEMM (common/src/ops/cpu/matmul_dnnl.cpp).
# SL_WITH_DNNL = AUTO (use it where Debian's libdnnl-dev, i.e. its CMake config dnnl-config.cmake, is found
# and usable), ON (required: fail with a hint if it is not) or OFF (the cast + sgemm path of
# common/src/ops/cpu/matmul.cpp). AUTO never fails a configure: a oneDNN that cannot be used becomes "oneDNN off
# (why; the package that would enable it)" in the summary. The GPU check machines build without it
# (scripts/pack_gpu_deps.sh does not copy it). Sets SL_DNNL_ENABLED and SL_DNNL_STATUS for the summary;
# common/CMakeLists.txt adds the source, the library and SL_WITH_DNNL=1.
#
# Why the config is read before it is loaded: Debian's oneDNN 2.6 is built with an OpenCL GPU runtime, and
# its dnnl-config.cmake calls find_package(OpenCL REQUIRED). OpenCL's development files
# (ocl-icd-opencl-dev) are only a Recommends of libdnnl-dev, so `apt-get install --no-install-recommends`
# leaves them out, and loading the config would then stop the whole configure, AUTO or not. So: find the
# config file, read which GPU runtime it needs, check that runtime's files exist, and only then load it.
function(_sl_dnnl_off why hint)
  if(SL_WITH_DNNL STREQUAL "ON")
    message(FATAL_ERROR "SL_WITH_DNNL=ON but oneDNN cannot be used: ${why}.\n  hint: ${hint}, "
                        "or configure with -DSL_WITH_DNNL=AUTO (oneDNN off) or -DSL_WITH_DNNL=OFF")
  endif()
  set(SL_DNNL_STATUS "oneDNN off (${why}; ${hint})" PARENT_SCOPE)
endfunction()

macro(sl_find_dnnl)
  set(SL_DNNL_ENABLED OFF)
  set(SL_DNNL_STATUS "oneDNN off (SL_WITH_DNNL=OFF)")
  if(NOT SL_WITH_DNNL MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "SL_WITH_DNNL='${SL_WITH_DNNL}' is not one of AUTO, ON, OFF.\n  hint: -DSL_WITH_DNNL=AUTO")
  endif()
  if(NOT SL_WITH_DNNL STREQUAL "OFF")
    find_path(SL_DNNL_CONFIG_DIR dnnl-config.cmake HINTS ${dnnl_DIR}
              PATH_SUFFIXES lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/dnnl lib/cmake/dnnl lib64/cmake/dnnl)
    if(NOT SL_DNNL_CONFIG_DIR)
      _sl_dnnl_off("its CMake config dnnl-config.cmake was not found"
                   "apt-get install libdnnl-dev, or pass -Ddnnl_DIR=<prefix>/lib/cmake/dnnl")
    else()
      file(STRINGS ${SL_DNNL_CONFIG_DIR}/dnnl-config.cmake _sl_dnnl_ocl REGEX "DNNL_GPU_RUNTIME \"OCL\"")
      set(_sl_dnnl_usable ON)
      if(_sl_dnnl_ocl)
        # The same module oneDNN's config uses; QUIET, so a missing OpenCL is ours to report. A cached path
        # that does not exist (-DOpenCL_INCLUDE_DIR=/nonexistent) counts as missing: find_package would take it.
        find_package(OpenCL QUIET)
        if(NOT OpenCL_FOUND OR NOT EXISTS "${OpenCL_INCLUDE_DIR}/CL/cl.h" OR NOT EXISTS "${OpenCL_LIBRARY}")
          _sl_dnnl_off("its CMake config needs OpenCL, whose headers or library were not found (OpenCL_INCLUDE_DIR='${OpenCL_INCLUDE_DIR}', OpenCL_LIBRARY='${OpenCL_LIBRARY}')"
                       "apt-get install ocl-icd-opencl-dev")
          set(_sl_dnnl_usable OFF)
        endif()
      endif()
      if(_sl_dnnl_usable)
        set(dnnl_DIR ${SL_DNNL_CONFIG_DIR})
        find_package(dnnl CONFIG QUIET)
        if(dnnl_FOUND AND TARGET DNNL::dnnl)
          set(SL_DNNL_ENABLED ON)
          set(SL_DNNL_STATUS "oneDNN ${dnnl_VERSION} (bf16 matmuls)")
        else()
          _sl_dnnl_off("its CMake config in ${SL_DNNL_CONFIG_DIR} did not define DNNL::dnnl"
                       "reinstall libdnnl-dev")
        endif()
      endif()
    endif()
  endif()
endmacro()

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

# CUDA: AUTO builds it where nvcc exists. Architectures default to 80;90 unless given (docs/style.md 35).
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
# Common compile settings for every scalelab target: the warnings, the same for C++ and CUDA.
#   C++   -Wall -Wextra -Wno-unused-parameter (an unused parameter is often part of an interface)
#   CUDA  the same flags for the host compiler (-Xcompiler: the host half of every .cu file), and nvcc's own
#         diagnostics (front end and ptxas: e.g. "#177-D variable declared but never referenced")
# SL_WERROR=ON (CI: scripts/test.sh) makes each of them an error: -Werror, -Xcompiler=-Werror, and nvcc's
# -Werror=all-warnings. tests/build/check_warning_flags.py (ctest build.warning_flags) checks that every
# source the build compiles gets these flags.
set(SL_CXX_WARNINGS -Wall -Wextra -Wno-unused-parameter)
set(SL_CUDA_WARNINGS -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
if(SL_WERROR)
  list(APPEND SL_CXX_WARNINGS -Werror)
  list(APPEND SL_CUDA_WARNINGS -Xcompiler=-Werror -Werror=all-warnings)
endif()
function(sl_target_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${SL_CXX_WARNINGS}>
                                           $<$<COMPILE_LANGUAGE:CUDA>:${SL_CUDA_WARNINGS}>)
endfunction()

# Where the reference track's sources come from. Default: the repository's solutions/. The planted-
# mistake runner (scripts/check_mistakes.py, docs/grading.md "Planted mistakes") points it at a copy
# of solutions/ that it patches, so solutions/ itself is never modified. Only the twins (sl_add_lab's
# SOURCES) are read from it; headers and given files (GIVEN) stay in labs/.
set(SL_SOLUTIONS_DIR ${PROJECT_SOURCE_DIR}/solutions CACHE PATH
    "Reference track sources (solutions/ or a copy of it, e.g. for scripts/check_mistakes.py)")

# sl_add_lab(<NN> <name> SOURCES <files> [GIVEN <files>] [DRIVER main.cpp] [DEPS libs...])
# (file names relative to the lab folder) Builds the lab's TODO functions twice:
#   labNN_learner  from labs/NN_name/<SOURCES>       compile definition SL_TRACK_LABNN=learner
#   labNN_ref      from solutions/NN_name/<SOURCES>  compile definition SL_TRACK_LABNN=ref
#                  (solutions/ = SL_SOLUTIONS_DIR, above)
# GIVEN: the lab's given code (everything around the TODO functions), written once in labs/NN_name/ and
# compiled into BOTH libraries (read from labs/, never from SL_SOLUTIONS_DIR): inside the inline namespace
# SL_TRACK_LABNN, each compile calls its own track's TODO functions, and the two can link into one program.
# With a DRIVER, the lab's program twice (sl_add_lab_program below).
# Other labs and programs link labNN_ref (docs/design.md "How the two tracks link").
function(sl_add_lab NN name)
  cmake_parse_arguments(A "" "DRIVER" "SOURCES;GIVEN;DEPS" ${ARGN})
  set(lab_dir ${PROJECT_SOURCE_DIR}/labs/${NN}_${name})
  set(sol_dir ${SL_SOLUTIONS_DIR}/${NN}_${name})
  list(TRANSFORM A_GIVEN PREPEND ${lab_dir}/ OUTPUT_VARIABLE given)
  foreach(track learner ref)
    if(track STREQUAL "learner")
      set(dir ${lab_dir})
      if(NOT SL_BUILD_LEARNER)
        continue()
      endif()
    else()
      set(dir ${sol_dir})
    endif()
    set(lib lab${NN}_${track})
    list(TRANSFORM A_SOURCES PREPEND ${dir}/ OUTPUT_VARIABLE srcs)
    add_library(${lib} STATIC ${srcs} ${given})
    target_include_directories(${lib} PUBLIC ${lab_dir})
    target_compile_definitions(${lib} PUBLIC SL_TRACK_LAB${NN}=${track})
    target_link_libraries(${lib} PUBLIC scalelab_common ${A_DEPS})
    sl_target_defaults(${lib})
    if(track STREQUAL "ref" AND NOT SL_SOLUTIONS_DIR STREQUAL "${PROJECT_SOURCE_DIR}/solutions")
      # A copy of solutions/ carries a planted mistake (scripts/check_mistakes.py): wrong code on purpose,
      # which may leave a variable unused. Its warnings stay warnings, so the mistake reaches its check.
      target_compile_options(${lib} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-error>)
    endif()
  endforeach()
  if(A_DRIVER)
    sl_add_lab_program(${NN} ${name} DRIVER ${A_DRIVER})
  endif()
endfunction()

# sl_add_lab_program(<NN> <name> DRIVER main.cpp [DEPS libs...]): the lab's program twice,
# bin/learner/labNN_name (linked with labNN_learner and DEPS) and bin/reference/labNN_name (labNN_ref and
# DEPS), each with the driver (scalelab_driver: common/include/scalelab/driver/) and the parts it hands
# the driver (labs/common/lab_parts.h: lab 02's loader, lab 01's throughput and MFU): the link set
# sl_lab_driver_labNN_<track> where one exists (lab 01's and lab 02's learner programs: each runs its own
# track of that lab end to end), sl_lab_driver otherwise (both references). Called by sl_add_lab with a
# DRIVER, or by sl_add_lab_from_manifest (a lab whose program has deps of its own: lab 02).
function(sl_add_lab_program NN name)
  cmake_parse_arguments(A "" "DRIVER" "DEPS" ${ARGN})
  set(lab_dir ${PROJECT_SOURCE_DIR}/labs/${NN}_${name})
  foreach(track learner ref)
    if(NOT TARGET lab${NN}_${track})
      continue()  # learner track off (SL_BUILD_LEARNER=OFF)
    endif()
    if(track STREQUAL "ref")
      set(bin_dir ${CMAKE_BINARY_DIR}/bin/reference)
      set(grade_track reference)
    else()
      set(bin_dir ${CMAKE_BINARY_DIR}/bin/learner)
      set(grade_track learner)
    endif()
    set(exe lab${NN}_${name}_${track})
    add_executable(${exe} ${lab_dir}/${A_DRIVER})
    target_link_libraries(${exe} PRIVATE lab${NN}_${track} ${A_DEPS})
    if(TARGET sl_lab_driver_lab${NN}_${track})
      target_link_libraries(${exe} PRIVATE sl_lab_driver_lab${NN}_${track})
    elseif(TARGET sl_lab_driver)
      target_link_libraries(${exe} PRIVATE sl_lab_driver)  # scalelab_driver, lab01_ref, lab02_ref (labs/CMakeLists.txt)
    endif()
    target_compile_definitions(${exe} PRIVATE SL_TRACK_NAME="${grade_track}")
    set_target_properties(${exe} PROPERTIES OUTPUT_NAME lab${NN}_${name} RUNTIME_OUTPUT_DIRECTORY ${bin_dir})
    sl_target_defaults(${exe})
    set_property(GLOBAL PROPERTY SL_LAB_${NN}_PROGRAM_${grade_track} ${exe})  # <build>/labs.json (below)
    # `scripts/grade NN` builds graded_labNN_<track>: let it rebuild the lab's program too, so the
    # program a learner runs next never lags behind the code that was just graded.
    if(NOT TARGET graded_lab${NN}_${grade_track})
      add_custom_target(graded_lab${NN}_${grade_track})
    endif()
    add_dependencies(graded_lab${NN}_${grade_track} ${exe})
  endforeach()
endfunction()

# ---------------------------------------------------------------------------------------------
# A lab is one unit: labs/NN_name/lab.json, its manifest (the fields: scripts/lib/labs.py; docs/design.md
# "A lab is one unit"), says what to build, and every script reads the same manifests (through
# <build>/labs.json, written below). Adding a lab is its folders and its manifest.
#   sl_read_lab_manifests()          (top-level CMakeLists.txt) reads every manifest, in number order, into
#                                    global properties: SL_LABS = 00;01;...; SL_LAB_<NN>_<FIELD> per lab
#   sl_add_lab_from_manifest(<NN>)   (labs/CMakeLists.txt) builds lab NN as its manifest says
#   sl_write_labs_json()             (labs/CMakeLists.txt) <build>/labs.json: the manifests, plus per lab
#                                    "programs": {"learner"|"reference": {"target", "path"} or null}

# A JSON array of strings (or null, or absent) as a CMake list; anything else stops the configure.
function(_sl_json_list out json key where)
  set(items "")
  string(JSON type ERROR_VARIABLE err TYPE "${json}" ${key})
  if(NOT err AND type STREQUAL "ARRAY")
    string(JSON n LENGTH "${json}" ${key})
    if(n GREATER 0)
      math(EXPR last "${n} - 1")
      foreach(i RANGE ${last})
        string(JSON item GET "${json}" ${key} ${i})
        list(APPEND items ${item})
      endforeach()
    endif()
  elseif(NOT err AND NOT type STREQUAL "NULL")
    message(FATAL_ERROR "${where}: \"${key}\" is ${type}, not a list of strings.\n  hint: \"${key}\": [\"...\"]")
  endif()
  set(${out} "${items}" PARENT_SCOPE)
endfunction()

# A JSON string (or null, or absent: "") of the manifest.
function(_sl_json_string out json key where)
  string(JSON value ERROR_VARIABLE err GET "${json}" ${key})
  if(err)
    set(value "")
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

function(sl_read_lab_manifests)
  file(GLOB manifests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/labs/[0-9][0-9]_*/lab.json)
  list(SORT manifests)  # number order: a lab links the reference of earlier labs
  set(numbers "")
  foreach(path ${manifests})
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
    file(RELATIVE_PATH where ${PROJECT_SOURCE_DIR} ${path})
    get_filename_component(dir ${path} DIRECTORY)
    get_filename_component(folder ${dir} NAME)
    file(READ ${path} json)
    string(JSON type ERROR_VARIABLE err TYPE "${json}")
    if(err OR NOT type STREQUAL "OBJECT")
      message(FATAL_ERROR "${where}: not a JSON object (${err}).\n"
                          "  hint: python3 scripts/lib/labs.py check names what is wrong")
    endif()
    foreach(key number name)
      string(JSON ${key} ERROR_VARIABLE err GET "${json}" ${key})
      if(err)
        message(FATAL_ERROR "${where}: no \"${key}\".\n  hint: python3 scripts/lib/labs.py check")
      endif()
    endforeach()
    if(NOT number MATCHES "^[0-9][0-9]$" OR NOT "${number}_${name}" STREQUAL folder)
      message(FATAL_ERROR "${where}: number \"${number}\" and name \"${name}\" do not spell the folder ${folder}.\n"
                          "  hint: the folder is labs/<two-digit number>_<name>")
    endif()
    _sl_json_list(twins "${json}" twins ${where})
    _sl_json_list(given "${json}" given ${where})
    _sl_json_list(deps "${json}" deps ${where})
    _sl_json_list(program_deps "${json}" program_deps ${where})
    _sl_json_list(tests "${json}" tests ${where})
    _sl_json_string(driver "${json}" driver ${where})
    set(P SL_LAB_${number})
    set_property(GLOBAL PROPERTY ${P}_NAME ${name})
    set_property(GLOBAL PROPERTY ${P}_MANIFEST ${path})
    set_property(GLOBAL PROPERTY ${P}_TWINS ${twins})
    set_property(GLOBAL PROPERTY ${P}_GIVEN ${given})
    set_property(GLOBAL PROPERTY ${P}_DRIVER ${driver})
    # "NN" -> labNN_ref (that lab's reference); any other name is a target of the lab's lab.cmake.
    list(TRANSFORM deps REPLACE "^([0-9][0-9])$" "lab\\1_ref")
    list(TRANSFORM program_deps REPLACE "^([0-9][0-9])$" "lab\\1_ref")
    set_property(GLOBAL PROPERTY ${P}_DEPS ${deps})
    set_property(GLOBAL PROPERTY ${P}_PROGRAM_DEPS ${program_deps})
    set_property(GLOBAL PROPERTY ${P}_TESTS ${tests})
    list(APPEND numbers ${number})
  endforeach()
  set_property(GLOBAL PROPERTY SL_LABS ${numbers})
endfunction()

# sl_add_lab_from_manifest(<NN>): lab NN as its manifest says. With twins: sl_add_lab (labNN_learner, labNN_ref;
# DEPS = "deps") and, with a driver, sl_add_lab_program (program_deps besides). Without twins (no TODOs, lab 00):
# one program for both tracks, bin/labNN_name. Then labs/NN_name/lab.cmake, where a lab keeps what is really
# its own (lab 08's given library, lab 09's bin/sl_plan); it runs in labs/CMakeLists.txt's scope, after the
# lab's targets exist.
function(sl_add_lab_from_manifest NN)
  foreach(field NAME TWINS GIVEN DRIVER DEPS PROGRAM_DEPS)
    get_property(${field} GLOBAL PROPERTY SL_LAB_${NN}_${field})
  endforeach()
  set(lab_dir ${PROJECT_SOURCE_DIR}/labs/${NN}_${NAME})
  if(TWINS)
    sl_add_lab(${NN} ${NAME} SOURCES ${TWINS} GIVEN ${GIVEN} DEPS ${DEPS})
    if(DRIVER)
      sl_add_lab_program(${NN} ${NAME} DRIVER ${DRIVER} DEPS ${PROGRAM_DEPS})
    endif()
  elseif(DRIVER)
    sl_add_tool(lab${NN}_${NAME} SOURCES ${lab_dir}/${DRIVER} DEPS ${DEPS} ${PROGRAM_DEPS})
    set_property(GLOBAL PROPERTY SL_LAB_${NN}_PROGRAM_learner lab${NN}_${NAME})
    set_property(GLOBAL PROPERTY SL_LAB_${NN}_PROGRAM_reference lab${NN}_${NAME})
  endif()
  if(EXISTS ${lab_dir}/lab.cmake)
    include(${lab_dir}/lab.cmake)
  endif()
endfunction()

# <build>/labs.json: {"source_dir", "build_dir", "labs": [each manifest with "programs"]}, written when the
# build system is generated (file(GENERATE): the program paths are $<TARGET_FILE>s). scripts/lib/labs.py reads it.
function(sl_write_labs_json)
  get_property(numbers GLOBAL PROPERTY SL_LABS)
  set(labs "")
  foreach(NN ${numbers})
    get_property(path GLOBAL PROPERTY SL_LAB_${NN}_MANIFEST)
    file(READ ${path} json)
    set(programs "")
    foreach(track learner reference)
      get_property(target GLOBAL PROPERTY SL_LAB_${NN}_PROGRAM_${track})
      if(target)
        string(APPEND programs ", \"${track}\": {\"target\": \"${target}\", \"path\": \"$<TARGET_FILE:${target}>\"}")
      else()
        string(APPEND programs ", \"${track}\": null")
      endif()
    endforeach()
    string(SUBSTRING "${programs}" 2 -1 programs)
    string(JSON json SET "${json}" programs "{${programs}}")
    if(labs)
      string(APPEND labs ",\n")
    endif()
    string(APPEND labs "${json}")  # not a CMake list: a manifest's text may hold ';'
  endforeach()
  set(dirs "\"source_dir\": \"${PROJECT_SOURCE_DIR}\", \"build_dir\": \"${CMAKE_BINARY_DIR}\"")
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/labs.json CONTENT "{${dirs},\n\"labs\": [\n${labs}\n]}\n")
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
# A GoogleTest executable; each of its TESTs becomes one ctest named <name>.<Suite>.<Test>.
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
  # One ctest per TEST, discovered when ctest runs, so a GTEST_SKIP (e.g. SL_REQUIRE_GPU without a GPU)
  # shows as "Skipped" in ctest's summary instead of hiding inside a passing program.
  # CMake 3.25 flattens list-valued PROPERTIES on their way through the discovery script, so each
  # ';' inside a list is escaped for the three expansions it goes through (7 literal backslashes).
  include(GoogleTest)
  set(env "OMP_NUM_THREADS=1;SL_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  string(REPLACE ";" "\\\\\\\\\\\\\\;" labels_escaped "${A_LABELS}")
  string(REPLACE ";" "\\\\\\\\\\\\\\;" env_escaped "${env}")
  # DISCOVERY_TIMEOUT: listing the tests starts the program, which loads the CUDA runtime, cuBLAS and
  # OpenBLAS first: seconds on a cold GPU machine, past CMake's 5 s default (ctest lint.gtest_discovery_timeout).
  gtest_discover_tests(${name} TEST_PREFIX "${name}." EXTRA_ARGS --gtest_color=no DISCOVERY_MODE PRE_TEST
                       DISCOVERY_TIMEOUT 120
                       PROPERTIES LABELS "${labels_escaped}" TIMEOUT ${A_TIMEOUT} ENVIRONMENT "${env_escaped}")
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
  message(STATUS "scalelab: ${cuda} | ${mpi} | BLAS ${SL_BLAS_BUILD} | ${SL_DNNL_STATUS} | ${tracks} | ${CMAKE_BUILD_TYPE}")
endfunction()

# ---------------------------------------------------------------------------------------------
# sl_add_graded_test(<NN> <name> SOURCES <files> CHECKS <Suite.Test>... [TIMEOUT s] [NP n] [DEPS libs...])
# A lab's graded checks (docs/design.md "Tests and the grading contract"; the records: docs/grading.md).
#   sl_add_graded_test(01 test_lab01 SOURCES test_lab01.cpp CHECKS Lab01SingleDevice.FlopsPerToken ...)
# Builds the test program twice, against labNN_learner and against labNN_ref:
#   tests/bin/learner/<name>  and  tests/bin/reference/<name>    (targets <name>_learner, <name>_reference)
# with tests/grading/graded_main.cpp as main(), and registers ONE ctest per check and track. Each runs
# that single TEST in its own process (under mpiexec when NP > 1) with a hard TIMEOUT, so a hang or a
# crash fails that check only:
#   name     labNN.<TEST name in snake_case>.<track>   TEST(Lab01SingleDevice, FlopsPerToken) on the
#            learner track -> lab01.flops_per_token.learner. grading::run insists that the check id
#            declared in the TEST body is the same labNN.<snake_case>, so ctest names are check ids.
#   labels   labNN;graded;cpu;<track>   (and mpi when NP > 1)
#   record   <build>/grades/<track>/<name>.json   (--gtest_output=json; scripts/grade reads it)
# The learner track's checks fail until the learner has done the lab (status not_implemented): that is
# their purpose, not a broken build. They carry the label `learner`, and scripts/test.sh runs the suite
# with -LE learner; scripts/grade runs them. (Not WILL_FAIL: that would make a learner's correct
# solution a failing test.) Two more things per call:
#   graded_labNN_<track>        a target that builds every graded program of the lab for that track
#   labNN.<name>.checks_listed  a ctest that fails when a TEST of the program is missing from CHECKS
#                               (it would never be graded) or CHECKS names a TEST that does not exist.
# ENVIRONMENT VAR=value ... adds to every check's environment (lab 06: SL_COMM_WAIT_TIMEOUT_S, so a
# deadlocked schedule fails with what each rank waited for well before the ctest TIMEOUT).
function(sl_add_graded_test NN name)
  cmake_parse_arguments(A "" "TIMEOUT;NP" "SOURCES;CHECKS;DEPS;ENVIRONMENT" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)  # seconds per check; a check that hangs fails after this
  endif()
  if(NOT A_NP)
    set(A_NP 1)
  endif()
  if(NOT A_CHECKS)
    message(FATAL_ERROR "sl_add_graded_test(${NN} ${name}): list the graded TESTs after CHECKS")
  endif()
  list(JOIN A_CHECKS "," checks_csv)

  foreach(track learner reference)
    if(track STREQUAL "learner")
      set(lib lab${NN}_learner)
    else()
      set(lib lab${NN}_ref)
    endif()
    if(NOT TARGET ${lib})
      continue()  # learner track off (SL_BUILD_LEARNER=OFF) or the lab is not built
    endif()
    set(exe ${name}_${track})
    add_executable(${exe} ${A_SOURCES} ${PROJECT_SOURCE_DIR}/tests/grading/graded_main.cpp)
    target_link_libraries(${exe} PRIVATE ${lib} sl_test_support GTest::gtest ${A_DEPS})
    target_compile_definitions(${exe} PRIVATE SL_GRADED_TRACK="${track}")
    set_target_properties(${exe} PROPERTIES OUTPUT_NAME ${name}
                          RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/bin/${track})
    sl_target_defaults(${exe})
    if(NOT TARGET graded_lab${NN}_${track})
      add_custom_target(graded_lab${NN}_${track})
    endif()
    add_dependencies(graded_lab${NN}_${track} ${exe})

    set(grades_dir ${CMAKE_BINARY_DIR}/grades/${track})
    file(MAKE_DIRECTORY ${grades_dir})
    set(env "OMP_NUM_THREADS=1;SL_SOURCE_DIR=${PROJECT_SOURCE_DIR}" ${A_ENVIRONMENT})
    set(labels "lab${NN};graded;cpu;${track}")
    set(launcher "")
    set(postflags "")
    if(A_NP GREATER 1)
      list(APPEND labels mpi)
      if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
        set(launcher ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${MPIEXEC_PREFLAGS}
                     --oversubscribe --bind-to none)
        set(postflags ${MPIEXEC_POSTFLAGS})
        list(APPEND env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
        # Each async op's output lands only at its own wait() (common/src/comm/mpi.cpp, "Delivery at
        # wait"): a learner who waits for some handles only fails instead of passing by luck.
        list(APPEND env SL_COMM_DELIVER_AT_WAIT=1)
      else()
        # Skip visibly (grading::run reads SL_GRADING_SKIP): the record says skipped, not passed.
        list(APPEND env "SL_GRADING_SKIP=needs ${A_NP} MPI ranks but this build has no MPI (apt-get install libopenmpi-dev openmpi-bin, then reconfigure)")
      endif()
    endif()

    foreach(check ${A_CHECKS})
      if(NOT check MATCHES "^([A-Za-z0-9]+)\\.([A-Za-z0-9]+)$")
        message(FATAL_ERROR "sl_add_graded_test(${NN} ${name}): CHECKS entry '${check}' is not Suite.TestName")
      endif()
      # TestName -> test_name (the same rule as snake_case() in tests/support/grading.cpp).
      string(REGEX REPLACE "([a-z0-9])([A-Z])" "\\1_\\2" snake "${CMAKE_MATCH_2}")
      string(TOLOWER "${snake}" snake)
      set(test lab${NN}.${snake}.${track})
      add_test(NAME ${test}
               COMMAND ${launcher} $<TARGET_FILE:${exe}> ${postflags} --gtest_filter=${check}
                       --gtest_color=no --gtest_output=json:${grades_dir}/${test}.json)
      set_tests_properties(${test} PROPERTIES LABELS "${labels}" TIMEOUT ${A_TIMEOUT} PROCESSORS ${A_NP}
                           ENVIRONMENT "${env}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\] ${check}")
    endforeach()
    if(track STREQUAL "reference")
      add_test(NAME lab${NN}.${name}.checks_listed COMMAND ${exe} --sl_expect_checks=${checks_csv})
      set_tests_properties(lab${NN}.${name}.checks_listed PROPERTIES LABELS "lab${NN};unit;cpu" TIMEOUT 30)
    endif()
  endforeach()
endfunction()

# ---------------------------------------------------------------------------------------------
# sl_add_mpi_test(<name> SOURCES <files> [NP 2 4] [LABELS ...] [DEPS libs...] [TIMEOUT s])
# A multi-rank GoogleTest program with tests/support/mpi/mpi_main.cpp as main() (the world communicator in
# test::world(), tests/support/mpi/mpi_test.h; results reduced across ranks), registered as ONE ctest per rank
# count, run under mpiexec:
#   name     <name>.np<N>
#   labels   mpi;cpu plus LABELS (e.g. common, lab03)
#   command  mpiexec -n N --oversubscribe --bind-to none <program> (as root: OMPI_ALLOW_RUN_AS_ROOT...)
# (CMake 3.25 has no TEST_LAUNCHER, hence one add_test per rank count.) Without MPI the tests are
# registered anyway and report Skipped, so a build without MPI says what it did not run.
function(sl_add_mpi_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;NP;LABELS;DEPS" ${ARGN})
  if(NOT A_NP)
    set(A_NP 2)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(labels mpi cpu ${A_LABELS})
  list(REMOVE_DUPLICATES labels)
  if(NOT MPI_CXX_FOUND OR NOT MPIEXEC_EXECUTABLE)
    foreach(np ${A_NP})
      add_test(NAME ${name}.np${np} COMMAND ${CMAKE_COMMAND} -E echo
               "SKIPPED: ${name} needs ${np} MPI ranks; apt-get install libopenmpi-dev openmpi-bin, then reconfigure")
      set_tests_properties(${name}.np${np} PROPERTIES LABELS "${labels}" SKIP_REGULAR_EXPRESSION "SKIPPED:")
    endforeach()
    return()
  endif()
  add_executable(${name} ${A_SOURCES} ${PROJECT_SOURCE_DIR}/tests/support/mpi/mpi_main.cpp)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/mpi)
  target_link_libraries(${name} PRIVATE scalelab_common sl_test_support GTest::gtest ${A_DEPS})
  target_compile_definitions(${name} PRIVATE SL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  sl_target_defaults(${name})
  foreach(np ${A_NP})
    add_test(NAME ${name}.np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
                     --oversubscribe --bind-to none $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS} --gtest_color=no)
    set_tests_properties(${name}.np${np} PROPERTIES LABELS "${labels}" TIMEOUT ${A_TIMEOUT} PROCESSORS ${np}
                         ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;SL_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  endforeach()
endfunction()
