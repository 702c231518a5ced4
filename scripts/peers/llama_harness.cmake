# Included after llama.cpp's project() by scripts/peers/llama.cpp.sh
# (-DCMAKE_PROJECT_llama.cpp_INCLUDE=THIS): adds the value-check harness
# llama_logits (our code, against include/llama.h) to the peer's build without
# changing llama.cpp. `llama` is defined later; linking by name resolves at
# generate time.
add_executable(llama_logits ${CMAKE_CURRENT_LIST_DIR}/llama_logits.cpp)
target_link_libraries(llama_logits PRIVATE llama)
target_compile_features(llama_logits PRIVATE cxx_std_17)
set_target_properties(llama_logits PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)

# ggml_dequant: ggml's own to_float on GGUF tensors (check_gguf_values.py --ggml-dequant)
add_executable(ggml_dequant ${CMAKE_CURRENT_LIST_DIR}/ggml_dequant.cpp)
target_link_libraries(ggml_dequant PRIVATE ggml)
target_compile_features(ggml_dequant PRIVATE cxx_std_17)
set_target_properties(ggml_dequant PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
