# Runs comm_fault_test under `mpirun --enable-recovery` with NP ranks, one of which kills
# itself (or prints TANDEM_FAULT_SKIPPED with the reason where it cannot run). Passes when every survivor (NP - 1) printed its success marker and no test failure
# was reported; mpirun's own exit status is not used because the killed rank makes it non-zero.
#   cmake -DMPIEXEC=mpirun -DNP=3 -DPROGRAM=path/to/comm_fault_test -P run_fault_test.cmake
set(_timeout 90)
execute_process(
  COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none --enable-recovery
          -np ${NP} ${PROGRAM}
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT ${_timeout})
message("${_out}")
message("${_err}")
# A test that cannot run here (e.g. NCCL without a GPU) prints the skip marker on every rank.
if(_out MATCHES "TANDEM_FAULT_SKIPPED")
  message(STATUS "fault test skipped (reason above)")
  return()
endif()
string(REGEX MATCHALL "TANDEM_FAULT_SURVIVOR_OK" _markers "${_out}")
list(LENGTH _markers _survivors_ok)
math(EXPR _expected "${NP} - 1")
if(NOT _survivors_ok EQUAL _expected)
  message(FATAL_ERROR "expected ${_expected} survivor markers, got ${_survivors_ok} (mpirun: ${_rc})")
endif()
if(_out MATCHES "\\[  FAILED  \\]")
  message(FATAL_ERROR "a survivor reported a test failure")
endif()
message(STATUS "fault test passed: ${_survivors_ok} survivors continued (mpirun exit: ${_rc})")
