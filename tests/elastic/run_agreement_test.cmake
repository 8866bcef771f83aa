# Runs agreement_test under `mpirun --enable-recovery` with NP ranks and one SCENARIO. Passes
# when exactly SURVIVORS ranks printed their success marker and no test failure was reported;
# mpirun's own exit status is not used because the killed ranks make it non-zero.
#   cmake -DMPIEXEC=mpirun -DNP=4 -DSCENARIO=kill_middle -DSURVIVORS=3 -DPROGRAM=... -P this
execute_process(
  COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe --bind-to none --enable-recovery
          -np ${NP} ${PROGRAM} --scenario=${SCENARIO}
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 100)
message("${_out}")
message("${_err}")
string(REGEX MATCHALL "TANDEM_AGREEMENT_SURVIVOR_OK" _markers "${_out}")
list(LENGTH _markers _ok)
if(NOT _ok EQUAL SURVIVORS)
  message(FATAL_ERROR "expected ${SURVIVORS} survivor markers, got ${_ok} (mpirun: ${_rc})")
endif()
if(_out MATCHES "\\[  FAILED  \\]")
  message(FATAL_ERROR "a survivor reported a test failure")
endif()
