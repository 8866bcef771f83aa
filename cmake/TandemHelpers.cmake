# Helpers that declare tandem's targets in one way everywhere.
#
#   tandem_library(NAME tandem_pipeline SRCS a.cc b.cc DEPS tandem_common [PRIVATE_DEPS ...])
#   tandem_test(NAME schedule_test SRCS schedule_test.cc DEPS tandem_pipeline [LABELS unit])
#   tandem_mpi_test(NAME comm_mpi_test NP 4 SRCS t.cc DEPS tandem_comm [ARGS ...] [MPIRUN_ARGS ...])
#
# Includes are rooted at the repository ("pipeline/schedule.h"); the generated config header is
# "common/config.h".

# A library is also installed and exported (cmake/TandemInstall.cmake) as tandem::<NAME without
# its "tandem_" prefix>: tandem_runtime_torch is tandem::runtime_torch.
function(tandem_library)
  cmake_parse_arguments(T "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${T_NAME} ${T_SRCS})
  target_include_directories(${T_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
    $<INSTALL_INTERFACE:include/tandem>)
  target_link_libraries(${T_NAME} PUBLIC ${T_DEPS} PRIVATE ${T_PRIVATE_DEPS})
  target_compile_options(${T_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  string(REGEX REPLACE "^tandem_" "" _export_name "${T_NAME}")
  set_target_properties(${T_NAME} PROPERTIES EXPORT_NAME ${_export_name})
  set_property(GLOBAL APPEND PROPERTY TANDEM_EXPORTED_TARGETS ${T_NAME})
endfunction()

function(tandem_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${T_NAME} PRIVATE TANDEM_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()

# A GoogleTest binary run under mpirun with NP ranks. Its main (tests/support/mpi_gtest_main.cc)
# initialises MPI with MPI_THREAD_MULTIPLE, silences stdout on ranks other than 0 and reduces
# failures across ranks, so one failing rank fails the test.
function(tandem_mpi_test)
  cmake_parse_arguments(T "" "NAME;NP;TIMEOUT" "SRCS;DEPS;LABELS;ARGS;MPIRUN_ARGS" ${ARGN})
  if(NOT TANDEM_HAVE_MPI)
    message(STATUS "tandem: skipping ${T_NAME} (no MPI)")
    return()
  endif()
  if(NOT TARGET ${T_NAME})
    add_executable(${T_NAME} ${T_SRCS})
    target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} tandem_mpi_gtest_main)
    target_compile_definitions(${T_NAME} PRIVATE TANDEM_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  endif()
  if(NOT T_NP)
    set(T_NP 2)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS mpi)
  endif()
  set(_test_name ${T_NAME}_np${T_NP})
  add_test(NAME ${_test_name}
           COMMAND ${TANDEM_MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none
                   -np ${T_NP} ${T_MPIRUN_ARGS} $<TARGET_FILE:${T_NAME}> ${T_ARGS})
  set_tests_properties(${_test_name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
                       ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OMP_NUM_THREADS=1")
endfunction()

# Points the shared imported targets whose names start with PREFIX (e.g. "absl::"), defined in
# the calling directory, at the static archives installed beside them (libX.so.N -> libX.a),
# when those exist. Every program then loads fewer shared objects at start-up.
function(tandem_prefer_static_archives PREFIX)
  get_property(_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_target IN LISTS _targets)
    string(FIND "${_target}" "${PREFIX}" _at)
    if(NOT _at EQUAL 0)
      continue()
    endif()
    get_target_property(_type ${_target} TYPE)
    if(NOT _type STREQUAL "SHARED_LIBRARY")
      continue()
    endif()
    get_target_property(_configs ${_target} IMPORTED_CONFIGURATIONS)
    set(_properties IMPORTED_LOCATION)
    foreach(_config IN LISTS _configs)
      list(APPEND _properties IMPORTED_LOCATION_${_config})
    endforeach()
    foreach(_property IN LISTS _properties)
      get_target_property(_location ${_target} ${_property})
      if(_location)
        string(REGEX REPLACE "\\.so(\\.[0-9.]+)?$" ".a" _archive "${_location}")
        if(NOT _archive STREQUAL _location AND EXISTS "${_archive}")
          set_target_properties(${_target} PROPERTIES ${_property} "${_archive}")
        endif()
      endif()
    endforeach()
  endforeach()
endfunction()

# GLPK::GLPK (cmake/FindGLPK.cmake) as the static archive with the archives of what Debian's
# libglpk needs (SuiteSparse AMD/COLAMD, zlib, libltdl, GMP), when every one is installed;
# otherwise unchanged. Call after find_package(GLPK).
function(tandem_prefer_static_glpk)
  if(NOT TARGET GLPK::GLPK)
    return()
  endif()
  get_target_property(_location GLPK::GLPK IMPORTED_LOCATION)
  get_filename_component(_dir "${_location}" DIRECTORY)
  set(_archives)
  foreach(_name glpk colamd amd suitesparseconfig z ltdl gmp)
    if(NOT EXISTS "${_dir}/lib${_name}.a")
      return()
    endif()
    list(APPEND _archives "${_dir}/lib${_name}.a")
  endforeach()
  list(POP_FRONT _archives _glpk)
  set_target_properties(GLPK::GLPK PROPERTIES
    IMPORTED_LOCATION "${_glpk}"
    INTERFACE_LINK_LIBRARIES "${_archives};${CMAKE_DL_LIBS}")
endfunction()
