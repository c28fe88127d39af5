# emu_oom.cmake — a CUDA step that does not fit on the device, end to end on the emulator (run
# by ctest as gpu.step_emu_oom; tests/gpu/codegen.cmake). The emulated device is shrunk to
# DEVICE bytes (SBP_CUDA_EMU_DEVICE_BYTES):
#   1. the llama fixture's store step: sbp-train must exit 1 naming the bytes asked and free
#      and suggesting the --memory-budget that would fit;
#   2. that budget given to `sbpc --strategy stream --memory-budget`: the step must fit on the
#      same device, train, and give the PyTorch reference's gradients.
#   -DSBPC= -DTRAIN= -DFIXTURE= -DCC= -DEMU_LIB= -DINCLUDES=a;b -DCFLAGS=... -DFX= -DOUT=
#   -DDEVICE=bytes
function(build_step name)
  execute_process(COMMAND ${SBPC} ${FX}/llama_op17_static.onnx ${ARGN} --target cuda
                          -o ${OUT}/${name}.c
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("sbpc ${ARGN}: ${out}${err}")
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "sbpc failed (${rc})")
  endif()
  set(inc)
  foreach(d "${OUT}" ${INCLUDES})
    list(APPEND inc "-I${d}")
  endforeach()
  execute_process(COMMAND ${CC} -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror ${CFLAGS} ${inc}
                          -o ${OUT}/${name}.so ${OUT}/${name}.c -Wl,-Bsymbolic -Wl,--whole-archive ${EMU_LIB}
                          -Wl,--no-whole-archive -lstdc++ -lm RESULT_VARIABLE rc)
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "compiling ${name}.c failed (${rc})")
  endif()
endfunction()

set(data --model ${FX}/llama_op17_static.onnx --input-ids ${FX}/ref/llama_input_ids.npy
         --labels ${FX}/ref/llama_labels.npy)
build_step(emu_oom_store --strategy store)
execute_process(COMMAND ${CMAKE_COMMAND} -E env SBP_CUDA_EMU_DEVICE_BYTES=${DEVICE}
                        ${TRAIN} ${OUT}/emu_oom_store.so ${data}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "the step that does not fit: expected exit status 1, got '${rc}'")
endif()
if(NOT err MATCHES "sbp-train: error: cannot allocate [^\n]*out of memory[^\n]*cudaMalloc of [0-9]+ bytes failed[^\n]*has [0-9]+ bytes free of ${DEVICE}")
  message(FATAL_ERROR "the error does not name the bytes asked and free")
endif()
if(NOT err MATCHES "sbp-train: note: [^\n]*--memory-budget ([0-9]+[KM]?)")
  message(FATAL_ERROR "no --memory-budget suggestion")
endif()
set(budget "${CMAKE_MATCH_1}")
message("suggested budget: ${budget}")

build_step(emu_oom_fit --strategy stream --memory-budget ${budget})
set(grads ${OUT}/emu_oom_fit_grads.safetensors)
file(REMOVE "${grads}")
execute_process(COMMAND ${CMAKE_COMMAND} -E env SBP_CUDA_EMU_DEVICE_BYTES=${DEVICE}
                        ${TRAIN} ${OUT}/emu_oom_fit.so ${data} --dump-grads ${grads}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "the step compiled for the suggested budget does not run (${rc})")
endif()
execute_process(COMMAND ${FIXTURE} check-ref ${grads} ${FX}/ref/llama_grads.safetensors
                RESULT_VARIABLE rc)
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "its gradients are off")
endif()
