# emu_base_bf16.cmake — sbpc --base-precision bf16 on the CUDA emulator, run by ctest
# (tests/gpu/codegen.cmake, gpu.step_emu_lora_base_bf16).
#
# A LoRA step with --precision bf16 is compiled twice: its frozen base weights kept as fp32
# master weights with a bf16 copy (the default), and kept as bf16 only (--base-precision bf16).
# The GEMMs read the same bf16 values either way (sbp-train rounds a weight to nearest even
# when it stores it, as the step's own copy does), so the two must train identically: the same
# losses, bit for bit, over 3 AdamW steps, the same first-step gradients (byte-identical dumps),
# the same trained adapters (byte-identical PEFT files), and the same merged model, as ONNX
# (--save --merge-lora) and as safetensors (--save-safetensors): W + (alpha/r)·B·A with the
# model file's own full-precision W, not its bf16 rounding. And the bf16-only step's
# parameter block and workspace must be smaller, by what the plan says: each weight kept as bf16
# costs 2 bytes instead of 4 in the block and no 2-byte copy in the workspace.
# The frozen embedding tables are among them: the lookup reads the bf16 table
# (sbprt_embedding_forward_bf16_table), whose rows are the fp32 table's lookup rounded to bf16,
# so they too train identically; TABLES is how many tables the model has (Llama: the token
# embedding; GPT-2: the token embedding, tied to the LM head, whose TorchScript export sbpc
# re-ties, and the learned position embedding).
#
#   -DSBPC= -DTRAIN= -DINFO= -DCC= -DEMU_LIB= -DINCLUDES=a;b -DCFLAGS=... -DMODEL= -DREF=
#   -DFAM= -DOUT= [-DTABLES=1]
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

if(NOT DEFINED TABLES)
  set(TABLES 1)
endif()
set(inc)
foreach(d "${OUT}" ${INCLUDES})
  list(APPEND inc "-I${d}")
endforeach()
file(MAKE_DIRECTORY "${OUT}")
foreach(base fp32 bf16)
  set(n "${OUT}/base_${base}")
  file(REMOVE_RECURSE "${n}.so" "${n}_grads.safetensors" "${n}_saved.onnx" "${n}_adapter"
       "${n}_merged.safetensors")
  run("sbpc --base-precision ${base}" ${SBPC} ${MODEL} --batch 2 --seq-len 32 --lora 4
      --lora-seed 5 --target cuda --precision bf16 --base-precision ${base}
      --strategy stream --chunk 7 --logits-chunk 5 -o ${n}.c)
  set(summary_${base} "${LAST_OUT}")
  file(READ "${n}.c" src)
  string(REGEX MATCHALL "sbprt_embedding_forward_bf16_table\\(" bf16_lookups_${base} "${src}")
  string(REGEX MATCHALL "sbprt_embedding_forward_bf16\\(" fp32_lookups_${base} "${src}")
  # -Bsymbolic: the step's cuda* calls bind to the emulator inside it (emu_step.cmake says why)
  run("compiling the step against the emulated CUDA runtime"
      ${CC} -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror ${CFLAGS} ${inc} -o ${n}.so ${n}.c
      -Wl,-Bsymbolic -Wl,--whole-archive ${EMU_LIB} -Wl,--no-whole-archive -lstdc++ -lm)
  run("step_info" ${INFO} ${n}.so cuda)
  string(STRIP "${LAST_OUT}" info)
  string(REPLACE " " ";" info "${info}")
  list(GET info 7 param_elems_${base})
  list(GET info 8 ws_${base})
  run("sbp-train (${base} base)" ${TRAIN} ${n}.so --model ${MODEL}
      --input-ids ${REF}/${FAM}_input_ids.npy --labels ${REF}/${FAM}_labels.npy --steps 3
      --lr 0.01 --dump-grads ${n}_grads.safetensors --save ${n}_saved.onnx --merge-lora
      --save-adapter ${n}_adapter --save-safetensors ${n}_merged.safetensors)
  string(REGEX MATCHALL "step [0-9]+ loss [^ ]+" losses_${base} "${LAST_OUT}")
  if(NOT LAST_OUT MATCHES "\\(cuda, ")
    message(FATAL_ERROR "sbp-train did not run the step as a cuda step")
  endif()
endforeach()

# what sbpc said it keeps as bf16, against the two steps' parameter blocks
if(NOT summary_bf16 MATCHES "base precision bf16: ([0-9]+) of [0-9]+ frozen weights \\(([0-9]+) elements\\)")
  message(FATAL_ERROR "sbpc --base-precision bf16 did not say what it keeps as bf16")
endif()
set(n_bf16 "${CMAKE_MATCH_1}")
set(elems "${CMAKE_MATCH_2}")
if(n_bf16 LESS 1)
  message(FATAL_ERROR "no weight kept as bf16")
endif()
# the embedding tables are among them, and every lookup of the bf16-only step reads one as
# bf16 (the fp32-master step: none)
if(NOT summary_bf16 MATCHES "kept as bf16 only \\(([0-9]+) embedding tables? among them\\)")
  message(FATAL_ERROR "sbpc --base-precision bf16 did not say how many embedding tables it keeps as bf16")
endif()
if(NOT CMAKE_MATCH_1 EQUAL TABLES)
  message(FATAL_ERROR "${CMAKE_MATCH_1} embedding tables kept as bf16, expected ${TABLES}")
endif()
list(LENGTH bf16_lookups_bf16 nb)
list(LENGTH fp32_lookups_bf16 nf)
list(LENGTH bf16_lookups_fp32 nb0)
if(nb LESS TABLES OR NOT nf EQUAL 0 OR NOT nb0 EQUAL 0)
  message(FATAL_ERROR "lookups of a bf16 table: ${nb} in the bf16-only step (and ${nf} of an fp32 "
                      "one), ${nb0} in the fp32-master step")
endif()
# each weight kept as bf16 takes ceil(numel / 2) floats after a 16-byte boundary: the block
# shrinks by at least elems/2 - 4 per weight, and at most elems/2
math(EXPR saved_floats "${param_elems_fp32} - ${param_elems_bf16}")
math(EXPR lo "${elems} / 2 - 4 * ${n_bf16}")
math(EXPR hi "${elems} / 2")
if(saved_floats LESS lo OR saved_floats GREATER hi)
  message(FATAL_ERROR "the parameter block shrank by ${saved_floats} floats; ${elems} elements "
                      "kept as bf16 should save between ${lo} and ${hi}")
endif()
# the workspace's bf16 copy no longer covers them: 2 bytes an element less (the activations'
# plan is the same; alignment moves the copy by less than 256 bytes)
math(EXPR ws_saved "${ws_fp32} - ${ws_bf16}")
math(EXPR ws_lo "2 * (${elems} - 8 * ${n_bf16}) - 256")
math(EXPR ws_hi "2 * ${elems} + 256")
if(ws_saved LESS ws_lo OR ws_saved GREATER ws_hi)
  message(FATAL_ERROR "the workspace shrank by ${ws_saved} bytes; expected about ${ws_lo}..${ws_hi}")
endif()
message("kept as bf16: ${n_bf16} weights, ${elems} elements: block ${param_elems_fp32} -> "
        "${param_elems_bf16} floats, workspace ${ws_fp32} -> ${ws_bf16} bytes")

list(LENGTH losses_fp32 nl)
if(NOT nl EQUAL 3 OR NOT losses_fp32 STREQUAL losses_bf16)
  message(FATAL_ERROR "the losses differ:\n  fp32 base: ${losses_fp32}\n  bf16 base: ${losses_bf16}")
endif()
foreach(f _grads.safetensors _saved.onnx _merged.safetensors _adapter/adapter_model.safetensors)
  file(SHA256 "${OUT}/base_fp32${f}" a)
  file(SHA256 "${OUT}/base_bf16${f}" b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "base${f} differs between the fp32 and the bf16-only base weights")
  endif()
endforeach()
# the bf16-only step saved the same file as the fp32 one, whose frozen weights are the
# model's own: --save left the frozen weights alone, in full precision
file(SHA256 "${OUT}/base_bf16_saved.onnx" s)
message("identical: losses ${losses_bf16}; gradients, adapters and the saved model (${s})")
