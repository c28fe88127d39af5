# emu_offload.cmake — sbpc --offload on the CUDA emulator, run by ctest
# (tests/gpu/codegen.cmake, gpu.step_emu_offload_<model>_<strategy>[_optimizer]).
#
# A bf16 cuda step is compiled twice, plain and with --offload WHAT (OFFLOAD: checkpoints, the
# default, or optimizer, or checkpoints,optimizer), and both are trained for STEPS AdamW steps
# from the same weights and batch.
#
# checkpoints: the offloaded step runs the same kernels on the same values (its checkpoints go to
# host memory and come back bit for bit), so everything must be identical: the loss of every step
# (as printed, to 6 decimals, and the first step's gradients as a byte-identical --dump-grads
# file), and the weights after the last step (byte-identical --save files). The emulator defers
# every copy on the copy stream to the wait that names it and fills its destination with NaN
# meanwhile (tests/gpu/emu/cuda_emu.h), so a transfer waited for too late, or a source overwritten
# before its copy, changes the numbers. And the device memory in use must fall by what the plan
# says: sbp-train's measured peak (bytes in use above the arena's start) by the two plans'
# workspace difference, which must be positive, while the step states its host workspace; and a
# --host-budget below that workspace is refused before any step.
#
# optimizer: sbp-train keeps the fp32 masters and AdamW's m and v on the host, updates them with
# its own (CPU) AdamW and stores the masters into the step's bf16 weights; the plain step updates
# on the device and its GEMMs read the bf16 copy it makes of the fp32 masters. The first step is
# the same computation (the same bf16 values: byte-identical gradients); after it the update runs
# in another runtime, so the losses and gradient norms of every step and the final checkpoint
# (masters, m, v) are held to 1e-6 relative (tests/dist/compare.py); and the device memory must
# fall by the parameter block's, the optimizer state's and the gradient block's planned bytes
# (the step says its gradients go to host memory: each is accumulated in the workspace and sent
# to the host block after its last contribution, which the workspace's growth pays for).
# With GRAD_ACCUM=K both steps are compiled for one row and trained with --grad-accum K, so the
# offloaded step's gradients come back from the host before each later micro-batch adds to them.
#
# The plain run is the same for every OFFLOAD of one model and strategy, so it can be made once:
# -DPLAIN_ONLY=ON compiles and trains the plain step alone into OUT (a ctest fixture's setup),
# and -DPLAIN_DIR=D takes the plain step and its outputs from such a D instead of making them.
#
#   -DSBPC= -DTRAIN= -DINFO= -DCC= -DEMU_LIB= -DINCLUDES=a;b -DCFLAGS=... -DMODEL= -DIDS=
#   -DLABELS= -DOUT= -DSTRATEGY= [-DSTEPS=10] [-DCHUNK=N -DLOGITS_CHUNK=N: stream's chunks]
#   [-DOFFLOAD=checkpoints|optimizer|checkpoints,optimizer -DPYTHON= -DCOMPARE=compare.py]
#   [-DGRAD_ACCUM=K] [-DPLAIN_ONLY=ON | -DPLAIN_DIR=D]
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

if(NOT STEPS)
  set(STEPS 10)
endif()
if(NOT OFFLOAD)
  set(OFFLOAD checkpoints)
endif()
set(ckpts OFF)
set(optim OFF)
if(OFFLOAD MATCHES "checkpoints")
  set(ckpts ON)
endif()
if(OFFLOAD MATCHES "optimizer")
  set(optim ON)
endif()
set(batch 2)
set(accum)
if(GRAD_ACCUM)
  set(batch 1)
  set(accum --grad-accum ${GRAD_ACCUM})
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
set(modes plain offload)
if(PLAIN_ONLY)
  set(modes plain)
elseif(PLAIN_DIR)
  set(modes offload)
endif()
foreach(mode ${modes})
  set(n "${OUT}/${mode}")
  file(REMOVE_RECURSE "${n}.so" "${n}_grads.safetensors" "${n}_saved.onnx" "${n}.jsonl"
       "${n}_ck")
  set(extra)
  if(mode STREQUAL "offload")
    set(extra --offload ${OFFLOAD})
  endif()
  # --no-eval: the arena holds the larger of the training and evaluation workspaces, and the
  # saving is the training one's
  run("sbpc (${mode})" ${SBPC} ${MODEL} --batch ${batch} --seq-len 32 --target cuda --precision bf16
      --strategy ${STRATEGY} ${chunks} --no-eval ${extra} -o ${n}.c)
  # -Bsymbolic: the step's cuda* calls bind to the emulator inside it (emu_step.cmake says why)
  run("compiling the ${mode} step against the emulated CUDA runtime"
      ${CC} -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror ${CFLAGS} ${inc} -o ${n}.so ${n}.c
      -Wl,-Bsymbolic -Wl,--whole-archive ${EMU_LIB} -Wl,--no-whole-archive -lstdc++ -lm)
  run("step_info (${mode})" ${INFO} ${n}.so cuda)
  string(STRIP "${LAST_OUT}" info)
  string(REPLACE " " ";" info "${info}")
  list(GET info 6 nparams_${mode})
  list(GET info 7 pelems_${mode})
  list(GET info 8 ws_${mode})
  list(GET info 9 host_${mode})
  list(GET info 10 offload_${mode})
  list(GET info 11 gelems_${mode})
  list(GET info 12 ghost_${mode})
  run("sbp-train (${mode})" ${TRAIN} ${n}.so --model ${MODEL} --input-ids ${IDS}
      --labels ${LABELS} --steps ${STEPS} --lr 0.01 --weight-decay 0.01 ${accum}
      --dump-grads ${n}_grads.safetensors --save ${n}_saved.onnx --log ${n}.jsonl
      --checkpoint-dir ${n}_ck --checkpoint-every ${STEPS})
  set(out_${mode} "${LAST_OUT}")
  file(WRITE "${n}.out" "${LAST_OUT}") # for -DPLAIN_DIR
  string(REGEX MATCHALL "step [0-9]+ loss [^ ]+" losses_${mode} "${LAST_OUT}")
  if(NOT LAST_OUT MATCHES "\\(cuda, ")
    message(FATAL_ERROR "sbp-train did not run the ${mode} step as a cuda step")
  endif()
  if(NOT LAST_OUT MATCHES "actual [^(]* \\(([0-9]+) bytes: arena")
    message(FATAL_ERROR "sbp-train printed no measured device memory for the ${mode} step")
  endif()
  set(dev_${mode} "${CMAKE_MATCH_1}")
endforeach()
if(PLAIN_ONLY)
  message("the plain ${STRATEGY} step and ${STEPS} steps of it are in ${OUT}")
  return()
endif()
set(p "${OUT}/plain") # the plain run's outputs, made above or by the fixture
if(PLAIN_DIR)
  set(p "${PLAIN_DIR}/plain")
  if(NOT EXISTS "${p}.out")
    message(FATAL_ERROR "no plain run in ${PLAIN_DIR} (its fixture test did not run or failed)")
  endif()
  file(READ "${p}.out" out_plain)
  string(REGEX MATCHALL "step [0-9]+ loss [^ ]+" losses_plain "${out_plain}")
  string(REGEX MATCH "actual [^(]* \\(([0-9]+) bytes: arena" m "${out_plain}")
  set(dev_plain "${CMAKE_MATCH_1}")
  run("step_info (plain)" ${INFO} ${p}.so cuda)
  string(STRIP "${LAST_OUT}" info)
  string(REPLACE " " ";" info "${info}")
  list(GET info 6 nparams_plain)
  list(GET info 7 pelems_plain)
  list(GET info 8 ws_plain)
  list(GET info 9 host_plain)
  list(GET info 10 offload_plain)
  list(GET info 11 gelems_plain)
  list(GET info 12 ghost_plain)
endif()

list(LENGTH losses_plain n_losses)
if(NOT n_losses EQUAL STEPS)
  message(FATAL_ERROR "expected ${STEPS} loss lines, got ${n_losses}: ${losses_plain}")
endif()
# the first step's gradients: the same computation either way
file(SHA256 "${p}_grads.safetensors" a)
file(SHA256 "${OUT}/offload_grads.safetensors" b)
if(NOT a STREQUAL b)
  message(FATAL_ERROR "the first step's gradients differ: the offloaded step is not the same "
                      "computation")
endif()
if(NOT optim)
  if(NOT losses_plain STREQUAL losses_offload)
    message(FATAL_ERROR "the offloaded step trains differently:\n  plain:   ${losses_plain}\n"
                        "  offload: ${losses_offload}")
  endif()
  file(SHA256 "${p}_saved.onnx" a)
  file(SHA256 "${OUT}/offload_saved.onnx" b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "plain_saved.onnx and offload_saved.onnx differ: the offloaded step is "
                        "not the same computation")
  endif()
else() # the update in the host's runtime: 1e-6
  set(ck "step-0000000${STEPS}.safetensors")
  if(STEPS GREATER 9)
    set(ck "step-000000${STEPS}.safetensors")
  endif()
  run("the losses and gradient norms against the plain run's (1e-6)"
      ${PYTHON} ${COMPARE} log ${OUT}/offload.jsonl ${p}.jsonl 1e-6)
  run("the masters, m and v after ${STEPS} steps against the plain run's (1e-6)"
      ${PYTHON} ${COMPARE} st2 ${OUT}/offload_ck/${ck} ${p}_ck/${ck} 1e-6)
endif()

if(NOT offload_plain STREQUAL "-" OR NOT host_plain EQUAL 0)
  message(FATAL_ERROR "the plain step says it offloads (${offload_plain}, ${host_plain} bytes)")
endif()
if(NOT offload_offload STREQUAL OFFLOAD)
  message(FATAL_ERROR "the offloaded step says it offloads '${offload_offload}', not ${OFFLOAD}")
endif()
if(NOT ghost_plain EQUAL 0 OR (optim AND NOT ghost_offload EQUAL 1) OR
   (NOT optim AND NOT ghost_offload EQUAL 0))
  message(FATAL_ERROR "the steps say their gradients are host memory: plain ${ghost_plain}, "
                      "offload ${ghost_offload} (expected 1 exactly with --offload optimizer)")
endif()
if(ckpts AND NOT host_offload GREATER 0)
  message(FATAL_ERROR "the offloaded step states no host workspace (${host_offload} bytes)")
endif()
if(NOT out_offload MATCHES "host workspace: ([0-9]+) bytes")
  message(FATAL_ERROR "sbp-train did not report the host memory the offload takes")
endif()
# a host that cannot hold what is offloaded: refused before any step, naming both byte counts,
# which are what the run reports it keeps on the host
execute_process(COMMAND ${TRAIN} ${OUT}/offload.so --model ${MODEL} --input-ids ${IDS}
                --labels ${LABELS} --steps 1 --host-budget 1K ${accum}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCH "host workspace: ([0-9]+) bytes" m "${out_offload}")
set(host_all "${CMAKE_MATCH_1}")
if(NOT rc EQUAL 1 OR NOT err MATCHES "keeps ${host_all} bytes .* in host memory .*--host-budget allows 1024 bytes"
   OR out MATCHES "step 1 loss")
  message(FATAL_ERROR "sbp-train --host-budget 1K: exit ${rc}, expected 1 and the ${host_all} "
                      "bytes named before any step:\n${out}${err}")
endif()
# the device's saving: the workspace's (checkpoints; optimizer: the bf16 weights need no copy
# in it, and the gradients on their way out take some), the parameter block's (bf16 weights, no
# fp32 masters) and, optimizer, AdamW's m and v and the gradient block (4 bytes each per
# gradient element, which the plain run keeps on the device)
math(EXPR planned "${ws_plain} - ${ws_offload} + 4 * (${pelems_plain} - ${pelems_offload})")
if(optim)
  math(EXPR planned "${planned} + 12 * ${gelems_plain}")
endif()
math(EXPR measured "${dev_plain} - ${dev_offload}")
if(NOT planned GREATER 0)
  message(FATAL_ERROR "the offloaded plan is not smaller: workspace ${ws_offload} bytes against "
                      "${ws_plain}, parameter block ${pelems_offload} floats against "
                      "${pelems_plain}")
endif()
# the arena rounds each of its pieces up to SBPRT_ALIGN (64 bytes), as do the plans; with the
# optimizer offloaded the plain run's device optimizer also kept its span table (runtime scratch
# outside the plans, runtime/cuda/optim.cu: 48 bytes a tensor and 48 for the totals)
math(EXPR slack "${planned} + 4 * 64")
if(optim)
  math(EXPR slack "${slack} + 48 * (${nparams_plain} + 1)")
endif()
if(measured LESS planned OR measured GREATER slack)
  message(FATAL_ERROR "device memory fell by ${measured} bytes (${dev_plain} -> ${dev_offload}), "
                      "the plans by ${planned} (workspace ${ws_plain} -> ${ws_offload}, "
                      "parameter block ${pelems_plain} -> ${pelems_offload} floats)")
endif()
message("offload ${OFFLOAD} (${STRATEGY}): ${STEPS} AdamW steps as the plain step's; device "
        "memory ${dev_plain} -> ${dev_offload} bytes (-${measured}, planned -${planned}); host "
        "workspace ${host_offload} bytes")
