# `cmake --install BUILD --prefix P`: the programs in P/bin, the libraries in P/lib, the headers
# under P/include/tandem/ at their source paths (#include "runtime/torch/model.h", as inside
# the tree; the generated common/config.h beside them) and a CMake package in
# P/lib/cmake/tandem, so that a project writes
#
#   find_package(tandem 0.1 REQUIRED)            # CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE tandem::train)
#
# Every library tandem_library() declares is exported as tandem::<name> (tandem::common,
# tandem::pipeline, tandem::planner, tandem::comm, tandem::runtime, tandem::runtime_torch,
# tandem::elastic, tandem::cluster, tandem::train, ...) with its dependencies: the package
# finds Abseil, nlohmann-json, Threads, LibTorch and the CUDA toolkit again, and defines the
# MPI and GLPK targets from what this build found, so a consumer needs no MPI language setup.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TANDEM_INSTALL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tandem)
get_property(_tandem_targets GLOBAL PROPERTY TANDEM_EXPORTED_TARGETS)
install(TARGETS ${_tandem_targets} EXPORT tandemTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(_program tandem tandem-torch)
  if(TARGET ${_program})
    install(TARGETS ${_program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

foreach(_module common pipeline planner comm runtime data formats elastic cluster cli)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_module})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_module} DESTINATION include/tandem
            FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/common/config.h DESTINATION include/tandem/common)

install(EXPORT tandemTargets NAMESPACE tandem:: DESTINATION ${TANDEM_INSTALL_CMAKE_DIR})

# What the package config re-creates: the properties of this build's MPI and GLPK targets.
function(_tandem_target_property OUT TARGET PROPERTY)
  set(_value "")
  if(TARGET ${TARGET})
    get_target_property(_value ${TARGET} ${PROPERTY})
    if(NOT _value)
      set(_value "")
    endif()
  endif()
  set(${OUT} "${_value}" PARENT_SCOPE)
endfunction()
_tandem_target_property(TANDEM_MPI_INCLUDE_DIRS MPI::MPI_C INTERFACE_INCLUDE_DIRECTORIES)
_tandem_target_property(TANDEM_MPI_LINK_LIBRARIES MPI::MPI_C INTERFACE_LINK_LIBRARIES)
_tandem_target_property(TANDEM_MPI_COMPILE_OPTIONS MPI::MPI_C INTERFACE_COMPILE_OPTIONS)
_tandem_target_property(TANDEM_MPI_COMPILE_DEFINITIONS MPI::MPI_C INTERFACE_COMPILE_DEFINITIONS)
_tandem_target_property(TANDEM_MPI_LINK_OPTIONS MPI::MPI_C INTERFACE_LINK_OPTIONS)
set(TANDEM_HAVE_GLPK 0)
if(TARGET GLPK::GLPK)
  set(TANDEM_HAVE_GLPK 1)
endif()
_tandem_target_property(TANDEM_GLPK_LOCATION GLPK::GLPK IMPORTED_LOCATION)
_tandem_target_property(TANDEM_GLPK_INCLUDE_DIRS GLPK::GLPK INTERFACE_INCLUDE_DIRECTORIES)
_tandem_target_property(TANDEM_GLPK_LINK_LIBRARIES GLPK::GLPK INTERFACE_LINK_LIBRARIES)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tandemConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/tandemConfig.cmake
                              INSTALL_DESTINATION ${TANDEM_INSTALL_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/tandemConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/tandemConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/tandemConfigVersion.cmake
        DESTINATION ${TANDEM_INSTALL_CMAKE_DIR})
