# One Hugging Face export end to end, as a user runs it (see CMakeLists.txt): sbpc MODEL OPTS
# -o OUT.so, sbp-train OUT.so on the reference batch for 10 AdamW steps with --dump-grads, then
# hf_check. Every command must exit 0; their output is printed, and kept in OUT.sbpc, OUT.log
# and OUT.check for tests/fixtures/hf/table.py. PARAMS, the initializer -> torch name map, is
# REF/KEY.params.txt unless given (tests/frontend/test_hf_export.py writes its own for
# sbp-export's exports, which are not the committed fixtures). TOL, when given, is hf_check's
# --tol: one bound for the gradients, the first loss and the AdamW losses (the MoE families').
function(run what file)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  file(WRITE ${file} "${out}${err}")
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "${what} exited with '${rc}'")
  endif()
endfunction()

file(REMOVE ${OUT}.check ${OUT}.sbpc ${OUT}.log)
# An export that stores 1 + w (Gemma's norms, folded by the exporter: kind 2 in the map) trains
# those values; AdamW's decay would act on 1 + w, so it runs without decay and is held to the
# reference's decay-free losses (Adam alone is shift-invariant).
if(NOT DEFINED PARAMS)
  set(PARAMS ${REF}/${KEY}.params.txt)
endif()
file(READ ${PARAMS} map)
set(wd 0.01)
set(wd0 "")
if(map MATCHES " 2\n")
  set(wd 0)
  set(wd0 --wd0)
endif()
run(sbpc ${OUT}.sbpc ${SBPC} ${MODEL} --batch 2 --seq-len 32 ${OPTS} -o ${OUT}.so)
run(sbp-train ${OUT}.log ${TRAIN} ${OUT}.so --model ${MODEL}
    --input-ids ${REF}/${FAM}_input_ids.npy --labels ${REF}/${FAM}_labels.npy
    --steps 10 --lr 0.01 --weight-decay ${wd} --threads 2 --dump-grads ${OUT}_grads.safetensors)
set(tol "")
if(TOL)
  set(tol --tol ${TOL})
endif()
run(hf_check ${OUT}.check ${CHECK} ${OUT}_grads.safetensors ${REF}/${FAM}.safetensors
    ${PARAMS} ${OUT}.log --steps 10 ${wd0} ${tol})
