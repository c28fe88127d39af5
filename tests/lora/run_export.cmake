# sbp-train --save-safetensors --merge-lora end to end (tests/lora/CMakeLists.txt): sbpc MODEL
# --lora 4 --lora-alpha 16 --lora-seed 3 -o OUT.so, 5 AdamW steps with --save-adapter
# OUT_adapter and --save-safetensors OUT_merged.safetensors --merge-lora; the untrained base
# model's export comes from a plain step (no --lora) run with --lr 0 and --save-safetensors
# OUT_base.safetensors (the plain export, tested against PyTorch's names in tests/cli).
# export_verify then checks merged = base + (alpha/r)·B·A from the saved adapters (CONV1D:
# GPT-2's [in, out] weights, the update transposed), under the base file's keys exactly.
# LORA_OPTS (optional): more sbpc --lora options (--lora-targets). LAYOUT=experts: a MoE model
# whose fused expert tensors are adapted, which export_verify's [out, in] / [in, out] matrices
# do not describe: only the PyTorch check (export_check.py, PEFT's merge_and_unload) holds it.
include("${CMAKE_CURRENT_LIST_DIR}/../run_checked.cmake") # run(what cmd...)

file(REMOVE_RECURSE ${OUT}_adapter)
file(REMOVE ${OUT}_merged.safetensors ${OUT}_base.safetensors)
set(data --input-ids ${HFREF}/${FAM}_input_ids.npy --labels ${HFREF}/${FAM}_labels.npy)
run(sbpc ${SBPC} ${MODEL} --batch 2 --seq-len 32 --lora 4 --lora-alpha 16 --lora-seed 3
    ${LORA_OPTS} -o ${OUT}.so)
run(sbp-train ${TRAIN} ${OUT}.so --model ${MODEL} ${data} --steps 5 --lr 1e-2 --threads 2
    --save-adapter ${OUT}_adapter --save-safetensors ${OUT}_merged.safetensors --merge-lora)
if(LAYOUT STREQUAL "experts")
  return()
endif()
run(sbpc ${SBPC} ${MODEL} --batch 2 --seq-len 32 -o ${OUT}_plain.so)
run(sbp-train ${TRAIN} ${OUT}_plain.so --model ${MODEL} ${data} --steps 1 --lr 0 --threads 2
    --save-safetensors ${OUT}_base.safetensors)
run(export_verify ${CHECK} ${OUT}_merged.safetensors ${OUT}_base.safetensors
    ${OUT}_adapter/adapter_model.safetensors 4 16 ${LAYOUT})
