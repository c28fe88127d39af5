# One Hugging Face export end to end, as a user runs it (see CMakeLists.txt): sbpc MODEL OPTS
# -o OUT.so, sbp-train OUT.so on the reference batch for 10 AdamW steps with --dump-grads, then
# hf_check. Every command must exit 0; their output is printed.
file(REMOVE ${OUT}.check ${OUT}.sbpc)
execute_process(COMMAND ${SBPC} ${MODEL} --batch 2 --seq-len 32 ${OPTS} -o ${OUT}.so
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
file(WRITE ${OUT}.sbpc "${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "sbpc exited with '${rc}'")
endif()
execute_process(COMMAND ${TRAIN} ${OUT}.so --model ${MODEL}
                        --input-ids ${REF}/${FAM}_input_ids.npy --labels ${REF}/${FAM}_labels.npy
                        --steps 10 --lr 0.01 --weight-decay 0.01 --threads 2
                        --dump-grads ${OUT}_grads.safetensors
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
file(WRITE ${OUT}.log "${out}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "sbp-train exited with '${rc}'")
endif()
execute_process(COMMAND ${CHECK} ${OUT}_grads.safetensors ${REF}/${FAM}.safetensors
                        ${REF}/${KEY}.params.txt ${OUT}.log --steps 10
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
file(WRITE ${OUT}.check "${out}${err}") # read by tests/fixtures/hf/table.py
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "hf_check exited with '${rc}'")
endif()
