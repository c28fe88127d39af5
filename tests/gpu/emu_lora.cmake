# emu_lora.cmake — a LoRA step (sbpc --lora) compiled for CUDA and run on the CPU
# emulator (tests/gpu/codegen.cmake, gpu.step_emu_lora_*), held to float64 PEFT as the CPU steps
# are in tests/lora (run_lora.cmake).
#
# sbpc MODEL --batch 2 --seq-len 32 --lora 4 --lora-alpha 8 SBPC_ARGS --target cuda: the C is
# compiled against libsbprt_cuda_emu.a as in emu_step.cmake; sbp-train trains it for 10 AdamW
# steps (its defaults, PEFT's trajectory in gen_lora.py) on the device-memory path with
# --dump-grads and --save-adapter; lora_check then holds the first step's adapter gradients,
# the 10 losses and the trained adapters to tests/fixtures/lora/ref/<family>.safetensors, at its
# own tolerances (1e-4, the first loss 1e-5) or at TOL for --precision bf16.
#
#   -DSBPC= -DTRAIN= -DINFO= -DCHECK= -DCC= -DEMU_LIB= -DINCLUDES=a;b -DCFLAGS=... -DMODEL=
#   -DHFREF= -DREF= -DFAM= -DOUT= -DNAME= -DSBPC_ARGS=... [-DTOL=x]
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

set(n "${OUT}/${NAME}")
file(REMOVE_RECURSE "${n}.so" "${n}_grads.safetensors" "${n}_adapter")
run("sbpc" ${SBPC} ${MODEL} --batch 2 --seq-len 32 --lora 4 --lora-alpha 8 ${SBPC_ARGS}
    --target cuda -o ${n}.c)
set(inc)
foreach(d "${OUT}" ${INCLUDES})
  list(APPEND inc "-I${d}")
endforeach()
# -Bsymbolic: the step's cuda* calls bind to the emulator inside it, even when sbp-train itself
# links the real libcudart (its NCCL path), which would otherwise interpose them
run("compiling the step against the emulated CUDA runtime"
    ${CC} -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror ${CFLAGS} ${inc} -o ${n}.so ${n}.c
    -Wl,-Bsymbolic -Wl,--whole-archive ${EMU_LIB} -Wl,--no-whole-archive -lstdc++ -lm)
run("step_info" ${INFO} ${n}.so cuda)
run("sbp-train" ${TRAIN} ${n}.so --model ${MODEL} --input-ids ${HFREF}/${FAM}_input_ids.npy
    --labels ${HFREF}/${FAM}_labels.npy --steps 10 --dump-grads ${n}_grads.safetensors
    --save-adapter ${n}_adapter)
if(NOT LAST_OUT MATCHES "\\(cuda, " OR NOT LAST_OUT MATCHES "peak device memory: planned")
  message(FATAL_ERROR "sbp-train did not run the step as a cuda step with device memory")
endif()
file(WRITE "${n}.log" "${LAST_OUT}")
run("the LoRA run against PEFT" ${CHECK} ${n}_adapter ${REF}/${FAM}.safetensors ${n}.log
    ${n}_grads.safetensors ${TOL})
