# emu_step.cmake — a whole CUDA training step on the CPU, run by ctest (tests/gpu/codegen.cmake).
#
# The step is what `sbpc --target cuda` emits (the C file), compiled with the C compiler and
# linked, instead of the CUDA runtime, against libsbprt_cuda_emu.a: the CUDA backend's own
# sources (ctx.c and every .cu kernel) built for tests/gpu/emu, the CPU emulator of CUDA. So the
# generated launch code, the device constants, the host copy of the labels, the final
# sbprt_sync, sbp-train's device-memory path (arena, copies in and out, the optimizer on the
# device) and the CUDA kernels all run, and the first step's gradients are held to the float64
# PyTorch references exactly as tests/train does for the CPU steps.
#
#   -DSBPC= -DTRAIN= -DFIXTURE= -DINFO= -DCC= -DEMU_LIB= -DINCLUDES=a;b -DCFLAGS=...
#   -DMODEL= -DFAMILY= -DREF= -DOUT= -DNAME= -DSBPC_ARGS=... -DSTEPS=N
#   [-DLOSSES=ON: also the AdamW losses against ref/<family>_adamw.json (STEPS >= 2)]
#   [-DSGD_SAVE=LR: train with SGD at LR, --save, and check the saved weights]
#   [-DTRAIN_INPUTS=...: sbp-train's inputs instead of ref/<family>_{input_ids,labels}.npy
#    (DPO / GRPO: the preference batch, --ref-logps, --grad-accum ...)]
#   [-DREF_GRADS=file: compare the gradients with this reference (train_fixture
#    compare-grads, 1e-4) instead of ref/<family>_grads.safetensors (check-ref)]
#   [-DTOL=x: compare-grads against REF_GRADS, or ref/<family>_grads.safetensors, at relative
#    tolerance x per tensor (and for the loss) instead of 1e-4: --precision bf16 steps]
#   [-DNOT_WITHIN=x: the gradients must NOT all be within x of ref/<family>_grads.safetensors
#    (a setting that changes the arithmetic, --tf32, took effect)]
#   [-DDECREASING=ON: every "step N loss X" line below the one before (STEPS >= 2)]
#   [-DHF_CHECK=hf_check -DHF_KEY=<export>: a real transformers export (tests/fixtures/hf): the
#    gradients, loss (and with LOSSES the AdamW losses) checked by tests/hf/hf_check against
#    ref/<family>.safetensors through ref/<export>.params.txt, at TOL when given]
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

set(c "${OUT}/${NAME}.c")
set(so "${OUT}/${NAME}.so")
set(grads "${OUT}/${NAME}_grads.safetensors")
file(REMOVE "${so}" "${grads}")
run("sbpc" ${SBPC} ${MODEL} ${SBPC_ARGS} --target cuda -o ${c})
set(inc)
foreach(d "${OUT}" ${INCLUDES})
  list(APPEND inc "-I${d}")
endforeach()
# -Bsymbolic: the step's cuda* calls bind to the emulator linked into it, even when sbp-train
# links the real libcudart (its NCCL path, tools/CMakeLists.txt), which would interpose them
run("compiling the step against the emulated CUDA runtime"
    ${CC} -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror ${CFLAGS} ${inc} -o ${so} ${c}
    -Wl,-Bsymbolic -Wl,--whole-archive ${EMU_LIB} -Wl,--no-whole-archive -lstdc++ -lm)
run("step_info" ${INFO} ${so} cuda)

if(NOT TRAIN_INPUTS)
  set(TRAIN_INPUTS --input-ids ${REF}/${FAMILY}_input_ids.npy --labels ${REF}/${FAMILY}_labels.npy)
endif()
set(train ${TRAIN} ${so} --model ${MODEL} ${TRAIN_INPUTS} --steps ${STEPS} --dump-grads ${grads})
if(SGD_SAVE)
  set(saved "${OUT}/${NAME}_saved.onnx")
  file(REMOVE "${saved}")
  list(APPEND train --optimizer sgd --lr ${SGD_SAVE} --save ${saved})
else()
  list(APPEND train --lr 0.01 --weight-decay 0.01)
endif()
run("sbp-train" ${train})
if(NOT LAST_OUT MATCHES "\\(cuda, " OR NOT LAST_OUT MATCHES "peak device memory: planned")
  message(FATAL_ERROR "sbp-train did not run the step as a cuda step with device memory")
endif()
# the step's launches are counted (sbprt_ctx_launches), the optimizer's among them
if(NOT LAST_OUT MATCHES "device launches: [1-9][0-9]* in the last step")
  message(FATAL_ERROR "sbp-train did not report the step's device launches")
endif()
set(log "${OUT}/${NAME}.log")
file(WRITE "${log}" "${LAST_OUT}")

if(HF_CHECK)
  set(check ${HF_CHECK} ${grads} ${REF}/${FAMILY}.safetensors ${REF}/${HF_KEY}.params.txt ${log})
  if(LOSSES)
    list(APPEND check --steps ${STEPS})
  endif()
  if(TOL)
    list(APPEND check --tol ${TOL})
  endif()
  run("the gradients against the transformers float64 reference" ${check})
  return()
endif()
set(check ${FIXTURE} check-ref ${grads} ${REF}/${FAMILY}_grads.safetensors)
if(NOT TOL)
  set(TOL 1e-4)
endif()
if(REF_GRADS)
  set(check ${FIXTURE} compare-grads ${grads} ${MODEL} ${REF_GRADS} ${MODEL} ${TOL})
elseif(NOT TOL STREQUAL "1e-4")
  set(check ${FIXTURE} compare-grads ${grads} ${MODEL} ${REF}/${FAMILY}_grads.safetensors ${MODEL}
      ${TOL})
endif()
if(DECREASING)
  string(REGEX MATCHALL "step [0-9]+ loss [-0-9.eE+naif]+" lines "${LAST_OUT}")
  list(LENGTH lines nlines)
  if(nlines LESS STEPS OR nlines LESS 2)
    message(FATAL_ERROR "expected ${STEPS} 'step N loss X' lines, got ${nlines}")
  endif()
  set(prev "")
  foreach(l IN LISTS lines)
    string(REGEX REPLACE "^step [0-9]+ loss " "" x "${l}")
    if(NOT prev STREQUAL "" AND NOT x LESS prev)
      message(FATAL_ERROR "the loss did not decrease: ${prev}, then ${x}")
    endif()
    set(prev "${x}")
  endforeach()
  message("the loss decreased over ${nlines} steps, to ${prev}")
endif()
if(LOSSES)
  list(APPEND check ${log} ${REF}/${FAMILY}_adamw.json)
endif()
run("the gradients against the PyTorch reference" ${check})
if(NOT_WITHIN)
  # the setting under test took effect: the gradients are measurably off the exact ones
  execute_process(COMMAND ${FIXTURE} compare-grads ${grads} ${MODEL}
                          ${REF}/${FAMILY}_grads.safetensors ${MODEL} ${NOT_WITHIN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the gradients agree with the reference within ${NOT_WITHIN}: the "
                        "setting did not change the arithmetic\n${out}${err}")
  endif()
  message("as expected, not within ${NOT_WITHIN} of the reference:\n${out}${err}")
endif()
if(SGD_SAVE)
  run("the saved weights" ${FIXTURE} check-sgd-save ${MODEL} ${saved} ${grads} ${SGD_SAVE})
endif()
