# One LoRA run end to end, as a user runs it (see CMakeLists.txt): sbpc MODEL --lora 4 OPTS -o
# OUT.so, sbp-train OUT.so for 10 AdamW steps (its defaults) with --dump-grads and
# --save-adapter OUT_adapter, lora_check against PEFT, then (when PEFT_CHECK is set and python
# has torch and peft) the saved adapter through peft.PeftModel.from_pretrained.
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

file(REMOVE_RECURSE ${OUT}_adapter)
run(sbpc ${SBPC} ${MODEL} --batch 2 --seq-len 32 --lora 4 --lora-alpha 8 ${OPTS} -o ${OUT}.so)
run(sbp-train ${TRAIN} ${OUT}.so --model ${MODEL}
    --input-ids ${HFREF}/${FAM}_input_ids.npy --labels ${HFREF}/${FAM}_labels.npy
    --steps 10 --threads 2 --dump-grads ${OUT}_grads.safetensors --save-adapter ${OUT}_adapter)
file(WRITE ${OUT}.log "${LAST_OUT}")
run(lora_check ${CHECK} ${OUT}_adapter ${REF}/${FAM}.safetensors ${OUT}.log
    ${OUT}_grads.safetensors)
