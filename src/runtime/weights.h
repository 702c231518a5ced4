// Views of checkpoint tensors as weights: matrices stay in the mmap (no copy
// for f32 / bf16), small vectors (norms, biases) are decoded to f32.
// Every function validates dtype and shape and throws Error naming the shard
// file and the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "format/safetensors.h"

namespace moetier::runtime {

// "FILE: tensor 'NAME'" for messages.
std::string tensor_where(const Checkpoint& ck, const TensorInfo& t);

// A [rows, cols] f32 or bf16 matrix viewed in place.
MatView matrix_view(const Checkpoint& ck, std::string_view name, int64_t rows, int64_t cols);

// A [n] f32 / bf16 / f16 vector decoded to f32.
std::vector<float> vector_f32(const Checkpoint& ck, std::string_view name, int64_t n);

// MXFP4 pair: weight U8/I8 [rows, cols/2] and scale F8_E8M0/U8 [rows, cols/32].
MatView mxfp4_view(const Checkpoint& ck, std::string_view weight, std::string_view scale,
                   int64_t rows, int64_t cols);

// CB3 pair: weight U8 [rows, ceil(cols*3/8)] (packed 3-bit codes) and
// codebook F16 [rows, 8] (kernels/cb3.h).
MatView cb3_view(const Checkpoint& ck, std::string_view weight, std::string_view codebook,
                 int64_t rows, int64_t cols);

// Rows [row0, row0 + rows) x cols of expert `index` in a stacked f32/bf16
// tensor [E, total_rows, cols].
MatView stacked_view(const Checkpoint& ck, std::string_view name, int64_t num_experts,
                     int64_t index, int64_t total_rows, int64_t row0, int64_t rows, int64_t cols);

}  // namespace moetier::runtime
