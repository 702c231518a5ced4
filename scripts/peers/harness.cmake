# Included after moetier's project() (cmake -DCMAKE_PROJECT_moetier_INCLUDE=THIS):
# adds the peer-check harness without touching moetier's own CMake files.
# moetier_runtime is defined later by add_subdirectory(src); linking by name is
# resolved at generate time.
add_executable(moetier_logits ${CMAKE_CURRENT_LIST_DIR}/moetier_logits.cpp)
target_link_libraries(moetier_logits PRIVATE moetier_runtime)
target_compile_features(moetier_logits PRIVATE cxx_std_20)  # CMAKE_CXX_STANDARD is set after this file
