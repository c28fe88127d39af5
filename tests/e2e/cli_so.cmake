# Runs PROG with ARGS (a ;-list) that write OUT (a .so): passes if it exits 0 and OUT, with
# the C source and header of the same stem, exists afterwards.
file(REMOVE "${OUT}")
execute_process(COMMAND ${PROG} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "expected exit status 0, got '${rc}'")
endif()
string(REGEX REPLACE "\\.so$" "" stem "${OUT}")
foreach(f "${OUT}" "${stem}.c" "${stem}.h")
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "${f} was not written")
  endif()
endforeach()
