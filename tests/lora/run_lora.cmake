# One LoRA run end to end, as a user runs it (see CMakeLists.txt): sbpc MODEL --lora 4 LORA_OPTS
# OPTS -o OUT.so, sbp-train OUT.so for 10 AdamW steps (its defaults) with --dump-grads and
# --save-adapter OUT_adapter, lora_check against PEFT (the saved adapter then goes through
# peft.PeftModel.from_pretrained in the lora.peft_load test of the same run, peft_load.py).
# LORA_OPTS (optional): the adapters' selection, e.g. --lora-targets REGEX for the MoE family's
# expert tensors; OPTS: the strategy and its chunks. TOL (optional): lora_check's TOL, one bound
# for every one of its figures (the MoE family is held to 1e-5, as tests/hf holds its steps).
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

file(REMOVE_RECURSE ${OUT}_adapter)
run(sbpc ${SBPC} ${MODEL} --batch 2 --seq-len 32 --lora 4 --lora-alpha 8 ${LORA_OPTS} ${OPTS}
    -o ${OUT}.so)
run(sbp-train ${TRAIN} ${OUT}.so --model ${MODEL}
    --input-ids ${HFREF}/${FAM}_input_ids.npy --labels ${HFREF}/${FAM}_labels.npy
    --steps 10 --threads 2 --dump-grads ${OUT}_grads.safetensors --save-adapter ${OUT}_adapter)
file(WRITE ${OUT}.log "${LAST_OUT}")
run(lora_check ${CHECK} ${OUT}_adapter ${REF}/${FAM}.safetensors ${OUT}.log
    ${OUT}_grads.safetensors ${TOL})
