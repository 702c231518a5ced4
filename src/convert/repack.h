// moetier repack --experts cb3: a new checkpoint whose expert matrices are CB3
// (kernels/cb3.h) fitted by weighted k-means (convert/cb3_fit.h), from any
// source expert layout the engine runs (stacked or per-expert f32/bf16,
// per-expert MXFP4). Every non-expert tensor is copied byte for byte; each
// expert becomes mlp.experts.E.{gate,up,down}_proj.{weight,codebook}, one
// 4 KiB-aligned record per expert (convert/output.h). config.json gains
// "moetier": {"experts_encoding": "cb3", "repacked_from": ENC, "cb3": {...}}.
//
// Memory: one output shard's expert tensors are held until the shard is
// written (the source's shard structure is kept), plus one decoded f32 matrix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "convert/calib.h"
#include "convert/output.h"

namespace moetier {

struct RepackOptions {
  std::string experts = "cb3";  // the only target encoding so far
  std::filesystem::path calib;  // corpus; empty: unit column weights
  CalibOptions calib_opt;
  int iterations = 16;  // Lloyd iterations per row (at most)
  ConvertControl control;
  std::function<void(const std::string&)> log;  // "calibrating on ..." (optional)
};

struct RepackReport {
  std::string source_encoding;                               // of the first MoE layer's experts
  uint64_t expert_bytes_before = 0, expert_bytes_after = 0;  // tensors under mlp.experts.
  int64_t matrices = 0;
  // Weighted relative squared error sum w (x - q)^2 / sum w x^2 per matrix
  // (the weights of the fit): mean and max over matrices.
  double rel_err_mean = 0, rel_err_max = 0;
  int64_t calib_tokens = 0, calib_windows = 0;
  int64_t calib_unrouted = 0;  // experts that no calibration token reached
};

RepackReport repack_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& out,
                               const RepackOptions& opt);

}  // namespace moetier
