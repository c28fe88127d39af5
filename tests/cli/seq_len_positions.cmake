# sbpc --seq-len against the positions the model records: MODEL copied to WORK with
# sbp-export's record of config.json appended (metadata_props "sbp.config.json", ModelProto
# field 14, which protobuf merges) holding max_position_embeddings 32; --seq-len 33 must warn
# "--seq-len 33 exceeds the model's 32 positions (max_position_embeddings)" and still exit 0,
# --seq-len 32 must not, and the model without the record is not checked.
#   cmake -DPROG=sbpc -DMODEL=M.onnx -DWORK=DIR -P seq_len_positions.cmake
file(MAKE_DIRECTORY "${WORK}")
file(COPY_FILE "${MODEL}" "${WORK}/m.onnx")
set(json "{\"max_position_embeddings\": 32}")
string(LENGTH "sbp.config.json" klen)
string(LENGTH "${json}" vlen)
math(EXPR elen "2 + ${klen} + 2 + ${vlen}") # every length below 128: one varint byte each
string(ASCII 114 ${elen} 10 ${klen} entry_head)  # field 14 (0x72), its length; key (0x0A)
string(ASCII 18 ${vlen} value_head)              # value (0x12)
file(APPEND "${WORK}/m.onnx" "${entry_head}sbp.config.json${value_head}${json}")
function(run seq model)
  execute_process(COMMAND ${PROG} ${model} --batch 1 --seq-len ${seq}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("sbpc --seq-len ${seq} ${model}: exit ${rc}\n${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected exit status 0, got '${rc}'")
  endif()
  set(err "${err}" PARENT_SCOPE)
endfunction()
set(warning "sbpc: warning: --seq-len 33 exceeds the model's 32 positions \\(max_position_embeddings\\)")
run(33 "${WORK}/m.onnx")
if(NOT err MATCHES "${warning}")
  message(FATAL_ERROR "no warning for --seq-len 33 over 32 positions")
endif()
run(32 "${WORK}/m.onnx")
if(err MATCHES "exceeds the model")
  message(FATAL_ERROR "a warning for --seq-len 32, which fits")
endif()
run(33 "${MODEL}")
if(err MATCHES "exceeds the model")
  message(FATAL_ERROR "a warning for a model that records no config")
endif()
