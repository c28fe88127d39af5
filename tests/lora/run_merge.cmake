# One --merge-lora run end to end (tests/lora/CMakeLists.txt): sbpc MODEL --lora 4 --lora-alpha
# 16 --lora-seed 3 LORA_OPTS -o OUT.so (not sbpc's defaults, so that sbp-train must take them
# from the step); sbp-train OUT.so --lr 0 --save-adapter OUT_init: the adapters are the seed's
# initial values (merge_verify --init); then 5 AdamW steps with --save-adapter OUT_adapter and
# --save OUT_merged.onnx --merge-lora, and merge_verify against W + (alpha/r)·B·A computed from
# those (LAYOUT: how the model stores the adapted weights, see merge_verify.c).
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

file(REMOVE_RECURSE ${OUT}_adapter ${OUT}_init)
file(REMOVE ${OUT}_merged.onnx)
run(sbpc ${SBPC} ${MODEL} --batch 2 --seq-len 32 --lora 4 --lora-alpha 16 --lora-seed 3
    ${LORA_OPTS} -o ${OUT}.so)
set(data --input-ids ${HFREF}/${FAM}_input_ids.npy --labels ${HFREF}/${FAM}_labels.npy)
run(sbp-train ${TRAIN} ${OUT}.so --model ${MODEL} ${data} --steps 1 --lr 0 --threads 2
    --save-adapter ${OUT}_init)
run(merge_verify ${CHECK} --init ${OUT}_init 3)
run(sbp-train ${TRAIN} ${OUT}.so --model ${MODEL} ${data} --steps 5 --threads 2
    --save-adapter ${OUT}_adapter --save ${OUT}_merged.onnx --merge-lora)
run(merge_verify ${CHECK} ${MODEL} ${OUT}_merged.onnx ${OUT}_adapter 4 16 ${LAYOUT})
