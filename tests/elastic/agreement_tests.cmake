# Membership agreement under real SIGKILL/SIGSTOP (see agreement_test.cc).
add_executable(elastic_agreement_test agreement_test.cc)
target_link_libraries(elastic_agreement_test PRIVATE tandem_elastic GTest::gtest)
# scenario:ranks:survivors
foreach(_case kill_middle:4:3 kill_rank0:4:3 kill_during:5:3 stop_middle:4:3 no_failure:3:3
              kill_middle:3:2)
  string(REPLACE ":" ";" _parts ${_case})
  list(GET _parts 0 _scenario)
  list(GET _parts 1 _np)
  list(GET _parts 2 _survivors)
  add_test(NAME elastic_agreement_${_scenario}_np${_np}
           COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${TANDEM_MPIEXEC} -DNP=${_np}
                   -DSCENARIO=${_scenario} -DSURVIVORS=${_survivors}
                   -DPROGRAM=$<TARGET_FILE:elastic_agreement_test>
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/run_agreement_test.cmake)
  set_tests_properties(elastic_agreement_${_scenario}_np${_np} PROPERTIES TIMEOUT 120
                       LABELS mpi)
endforeach()
