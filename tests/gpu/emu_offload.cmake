# emu_offload.cmake — sbpc --offload checkpoints on the CUDA emulator, run by ctest
# (tests/gpu/codegen.cmake, gpu.step_emu_offload_<model>_<strategy>).
#
# A bf16 cuda step is compiled twice, plain and with --offload checkpoints, and both are
# trained for STEPS AdamW steps from the same weights and batch. The offloaded step runs the
# same kernels on the same values (its checkpoints go to host memory and come back bit for bit),
# so everything must be identical: the loss of every step (as printed, to 6 decimals, and the
# first step's gradients as a byte-identical --dump-grads file), and the weights after the last
# step (byte-identical --save files). The emulator defers every copy on the copy stream to the
# wait that names it and fills its destination with NaN meanwhile (tests/gpu/emu/cuda_emu.h), so
# a transfer waited for too late, or a source overwritten before its copy, changes the numbers.
# And the device memory in use must fall by what the plan says: sbp-train's measured peak
# (bytes in use above the arena's start) by the two plans' workspace difference, which must be
# positive, while the step states its host workspace; and a --host-budget below that workspace
# is refused before any step.
#
#   -DSBPC= -DTRAIN= -DINFO= -DCC= -DEMU_LIB= -DINCLUDES=a;b -DCFLAGS=... -DMODEL= -DIDS=
#   -DLABELS= -DOUT= -DSTRATEGY= [-DSTEPS=10] [-DCHUNK=N -DLOGITS_CHUNK=N: stream's chunks]
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

if(NOT STEPS)
  set(STEPS 10)
endif()
set(chunks)
if(CHUNK)
  set(chunks --chunk ${CHUNK} --logits-chunk ${LOGITS_CHUNK})
endif()
set(inc)
foreach(d "${OUT}" ${INCLUDES})
  list(APPEND inc "-I${d}")
endforeach()
file(MAKE_DIRECTORY "${OUT}")
foreach(mode plain offload)
  set(n "${OUT}/${mode}")
  file(REMOVE "${n}.so" "${n}_grads.safetensors" "${n}_saved.onnx")
  set(extra)
  if(mode STREQUAL "offload")
    set(extra --offload checkpoints)
  endif()
  # --no-eval: the arena holds the larger of the training and evaluation workspaces, and the
  # saving is the training one's
  run("sbpc (${mode})" ${SBPC} ${MODEL} --batch 2 --seq-len 32 --target cuda --precision bf16
      --strategy ${STRATEGY} ${chunks} --no-eval ${extra} -o ${n}.c)
  # -Bsymbolic: the step's cuda* calls bind to the emulator inside it (emu_step.cmake says why)
  run("compiling the ${mode} step against the emulated CUDA runtime"
      ${CC} -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror ${CFLAGS} ${inc} -o ${n}.so ${n}.c
      -Wl,-Bsymbolic -Wl,--whole-archive ${EMU_LIB} -Wl,--no-whole-archive -lstdc++ -lm)
  run("step_info (${mode})" ${INFO} ${n}.so cuda)
  string(STRIP "${LAST_OUT}" info)
  string(REPLACE " " ";" info "${info}")
  list(GET info 8 ws_${mode})
  list(GET info 9 host_${mode})
  list(GET info 10 offload_${mode})
  run("sbp-train (${mode})" ${TRAIN} ${n}.so --model ${MODEL} --input-ids ${IDS}
      --labels ${LABELS} --steps ${STEPS} --lr 0.01 --weight-decay 0.01
      --dump-grads ${n}_grads.safetensors --save ${n}_saved.onnx)
  set(out_${mode} "${LAST_OUT}")
  string(REGEX MATCHALL "step [0-9]+ loss [^ ]+" losses_${mode} "${LAST_OUT}")
  if(NOT LAST_OUT MATCHES "\\(cuda, ")
    message(FATAL_ERROR "sbp-train did not run the ${mode} step as a cuda step")
  endif()
  if(NOT LAST_OUT MATCHES "actual [^(]* \\(([0-9]+) bytes: arena")
    message(FATAL_ERROR "sbp-train printed no measured device memory for the ${mode} step")
  endif()
  set(dev_${mode} "${CMAKE_MATCH_1}")
endforeach()

list(LENGTH losses_plain n_losses)
if(NOT n_losses EQUAL STEPS)
  message(FATAL_ERROR "expected ${STEPS} loss lines, got ${n_losses}: ${losses_plain}")
endif()
if(NOT losses_plain STREQUAL losses_offload)
  message(FATAL_ERROR "the offloaded step trains differently:\n  plain:   ${losses_plain}\n"
                      "  offload: ${losses_offload}")
endif()
foreach(f grads.safetensors saved.onnx)
  file(SHA256 "${OUT}/plain_${f}" a)
  file(SHA256 "${OUT}/offload_${f}" b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "plain_${f} and offload_${f} differ: the offloaded step is not the "
                        "same computation")
  endif()
endforeach()

if(NOT offload_plain STREQUAL "-" OR NOT host_plain EQUAL 0)
  message(FATAL_ERROR "the plain step says it offloads (${offload_plain}, ${host_plain} bytes)")
endif()
if(NOT offload_offload STREQUAL "checkpoints" OR NOT host_offload GREATER 0)
  message(FATAL_ERROR "the offloaded step states no host workspace (${offload_offload}, "
                      "${host_offload} bytes)")
endif()
if(NOT out_offload MATCHES "host workspace: ${host_offload} bytes")
  message(FATAL_ERROR "sbp-train did not report the step's ${host_offload}-byte host workspace")
endif()
# a host that cannot hold the checkpoints: refused before any step, naming both byte counts
execute_process(COMMAND ${TRAIN} ${OUT}/offload.so --model ${MODEL} --input-ids ${IDS}
                --labels ${LABELS} --steps 1 --host-budget 1K
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "keeps ${host_offload} bytes .* of layer checkpoints in host memory .*--host-budget allows 1024 bytes"
   OR out MATCHES "step 1 loss")
  message(FATAL_ERROR "sbp-train --host-budget 1K: exit ${rc}, expected 1 and the bytes named "
                      "before any step:\n${out}${err}")
endif()
math(EXPR planned "${ws_plain} - ${ws_offload}")
math(EXPR measured "${dev_plain} - ${dev_offload}")
if(NOT planned GREATER 0)
  message(FATAL_ERROR "the offloaded plan is not smaller: workspace ${ws_offload} bytes against "
                      "${ws_plain}")
endif()
# the arena rounds each of its pieces up to SBPRT_ALIGN (64 bytes), as do the plans
math(EXPR slack "${planned} + 64")
if(measured LESS planned OR measured GREATER slack)
  message(FATAL_ERROR "device memory fell by ${measured} bytes (${dev_plain} -> ${dev_offload}), "
                      "the plans by ${planned} (${ws_plain} -> ${ws_offload})")
endif()
message("offload (${STRATEGY}): ${STEPS} AdamW steps identical; device memory "
        "${dev_plain} -> ${dev_offload} bytes (-${measured}, planned -${planned}); "
        "host workspace ${host_offload} bytes")
