# cuda_step.cmake — run by ctest (tests/gpu/codegen.cmake) for a step built with
# `sbpc --target cuda`:
#   MODE=build  runs SBPC with ARGS (a ;-list writing OUT, a .so) and checks that it exits 0,
#               that OUT with its .c and .h exists, and that INFO (step_info) reports target
#               cuda and finds every export;
#   MODE=run    runs TRAIN with ARGS: on a machine without a GPU it must exit 1 with a message
#               "sbp-train: error: ... no CUDA device" (not a crash); where a GPU is present it
#               must train (exit 0, "step 1 loss").
if(MODE STREQUAL "build")
  file(REMOVE "${OUT}")
  execute_process(COMMAND ${SBPC} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "sbpc: expected exit status 0, got '${rc}'")
  endif()
  string(REGEX REPLACE "\\.so$" "" stem "${OUT}")
  foreach(f "${OUT}" "${stem}.c" "${stem}.h")
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "${f} was not written")
    endif()
  endforeach()
  execute_process(COMMAND ${INFO} "${OUT}" cuda RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message("step_info: ${out}${err}")
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "step_info: the step is not a complete cuda step (${rc})")
  endif()
elseif(MODE STREQUAL "c")
  # MODE=c: SBPC with ARGS writes OUT (a .c) for --target cuda, with or without a CUDA compiler
  file(REMOVE "${OUT}")
  execute_process(COMMAND ${SBPC} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc STREQUAL "0" OR NOT EXISTS "${OUT}")
    message(FATAL_ERROR "sbpc did not write ${OUT} (${rc})")
  endif()
  file(READ "${OUT}" c)
  foreach(want ".target = \"cuda\"" "int sbp_step_init(sbprt_ctx *ctx)" "TRY(sbprt_sync(ctx));"
          "SBPRT_COPY_DEVICE_TO_HOST")
    string(FIND "${c}" "${want}" at)
    if(at LESS 0)
      message(FATAL_ERROR "${OUT} lacks '${want}'")
    endif()
  endforeach()
elseif(MODE STREQUAL "run")
  execute_process(COMMAND ${TRAIN} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message("${out}${err}")
  if(rc STREQUAL "0")
    if(NOT out MATCHES "step 1 loss [0-9.]+")
      message(FATAL_ERROR "exit status 0 but no 'step 1 loss' line")
    endif()
    message("a CUDA device is present: the step ran")
  elseif(rc STREQUAL "1")
    if(NOT err MATCHES "sbp-train: error: [^\n]*no CUDA device")
      message(FATAL_ERROR "exit status 1, but the message does not say 'no CUDA device'")
    endif()
    message("no CUDA device: sbp-train said so and exited 1")
  else()
    message(FATAL_ERROR "expected exit status 1 (no device) or 0 (a device), got '${rc}'")
  endif()
else()
  message(FATAL_ERROR "MODE must be build, c or run")
endif()
