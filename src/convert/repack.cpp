#include "convert/repack.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "convert/cb3_fit.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "format/safetensors.h"
#include "kernels/cb3.h"
#include "kernels/cpu/cpu.h"
#include "model/architecture.h"
#include "runtime/mapped_experts.h"

namespace moetier {
namespace fs = std::filesystem;

namespace {

std::string layout_name(const Checkpoint& ck, const MoeTensorNames& n, int64_t layer) {
  switch (detect_expert_layout(ck, n, layer)) {
    case ExpertLayout::Stacked:
      return fmt::format("stacked {}",
                         dtype_name(ck.get(n.experts_prefix(layer) + n.stacked_gate_up).dtype));
    case ExpertLayout::PerExpert:
      return std::string(
          dtype_name(ck.get(n.experts_prefix(layer) + "0." + n.projs[0] + ".weight").dtype));
    case ExpertLayout::PerExpertMxfp4:
      return std::string(encoding_name(WeightEncoding::MXFP4));
    case ExpertLayout::PerExpertCb3:
      return std::string(encoding_name(WeightEncoding::CB3));
  }
  return "?";
}

struct Repacker {
  const Checkpoint& ck;
  const ModelSpec& cfg;
  const MoeTensorNames& names;
  const RepackOptions& opt;
  DerivedCheckpointWriter& w;
  MappedExperts src;
  const CalibStats* calib = nullptr;
  RepackReport rep;
  std::vector<float> dense;               // [rows, cols] the matrix being encoded
  std::map<int64_t, uint32_t> rec_shard;  // record_key(layer, expert) -> output shard

  Repacker(const Checkpoint& c, const ModelSpec& f, const RepackOptions& o,
           DerivedCheckpointWriter& wr)
      : ck(c), cfg(f), names(f.names()), opt(o), w(wr), src(c, f) {}

  // Row-wise decode of a source matrix to f32; throws on NaN/Inf.
  void decode(const MatView& m, const std::string& name) {
    dense.resize(size_t(m.rows * m.cols));
    const int64_t grain = m.rows * m.cols >= (int64_t(1) << 18) ? 16 : m.rows;
    global_pool().parallel_for(m.rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) cpu::get_row(m, r, dense.data() + r * m.cols);
    });
    const auto bad =
        std::find_if(dense.begin(), dense.end(), [](float v) { return !std::isfinite(v); });
    check(bad == dense.end(), "{}: tensor '{}': element {} is not finite; cannot fit a codebook",
          ck.dir().string(), name, bad - dense.begin());
  }

  // Encodes projection p (0 gate, 1 up, 2 down) of (layer, expert) into two
  // output tensors.
  void emit(int64_t layer, int64_t expert, int p, std::vector<OutTensor>& out) {
    if (opt.control.progress)
      opt.control.progress(rep.matrices + 1,
                           int64_t(cfg.moe_layers().size()) * cfg.num_experts * 3);
    const ExpertView& v = src.view(layer, int32_t(expert));
    const MatView& m = p == 0 ? v.gate : p == 1 ? v.up : v.down;
    const std::string base =
        fmt::format("{}{}.{}.", names.experts_prefix(layer), expert, names.projs[size_t(p)]);
    decode(m, base + "weight");
    std::vector<float> cw;
    if (calib) cw = calib->weights(layer, expert, p == 2);
    const int64_t rb = kernels::cb3_row_bytes(m.cols);
    OutTensor codes, book;
    codes.owned.resize(size_t(m.rows * rb));
    book.owned.resize(size_t(m.rows * kernels::kCb3Centroids * 2));
    const Cb3Error e =
        cb3_encode_matrix(dense.data(), m.rows, m.cols, cw.empty() ? nullptr : cw.data(),
                          opt.iterations, reinterpret_cast<uint8_t*>(codes.owned.data()),
                          reinterpret_cast<uint8_t*>(book.owned.data()));
    codes.t = {base + "weight", DType::U8, {m.rows, rb}, codes.owned};
    book.t = {base + "codebook", DType::F16, {m.rows, kernels::kCb3Centroids}, book.owned};
    codes.record = book.record = record_key(layer, expert);
    rep.expert_bytes_after += codes.owned.size() + book.owned.size();
    rep.rel_err_mean += e.relative();
    rep.rel_err_max = std::max(rep.rel_err_max, e.relative());
    ++rep.matrices;
    out.push_back(std::move(codes));
    w.tick();
    out.push_back(std::move(book));
    w.tick();
  }

  // The output tensors of shard s that come from source tensor t (expert
  // records go to the shard of their first source tensor).
  void convert(const TensorInfo& t, uint32_t s, std::vector<OutTensor>& out) {
    const auto n = parse_layer_tensor(t.name, names);
    const bool expert = n && n->layer < cfg.num_layers && cfg.is_moe_layer(n->layer) &&
                        is_expert_rest(n->rest, names);
    if (!expert) {
      if (t.shard != s) return;
      OutTensor o;
      o.t = {t.name, t.dtype, t.shape, ck.bytes(t)};
      out.push_back(std::move(o));
      return w.tick();
    }
    if (t.shard == s) rep.expert_bytes_before += t.nbytes();
    auto mine = [&](int64_t e) { return rec_shard.at(record_key(n->layer, e)) == s; };
    if (n->rest == names.experts + names.stacked_gate_up) {
      for (int64_t e = 0; e < cfg.num_experts; ++e)
        if (mine(e)) emit(n->layer, e, 0, out), emit(n->layer, e, 1, out);
    } else if (n->rest == names.experts + names.stacked_down) {
      for (int64_t e = 0; e < cfg.num_experts; ++e)
        if (mine(e)) emit(n->layer, e, 2, out);
    } else if (n->expert >= 0 && mine(n->expert)) {
      for (int p = 0; p < 3; ++p)
        if (n->part == names.projs[size_t(p)] + ".weight") emit(n->layer, n->expert, p, out);
      // *.scale (MXFP4) is folded into the codebook fit of its weight.
    }
  }

  void run() {
    const auto order = tensors_in_file_order(ck);
    rec_shard = record_shards(order, cfg.num_experts, names);
    for (uint32_t s = 0; s < ck.shards().size(); ++s) {
      std::vector<OutTensor> tensors;
      for (const TensorInfo* t : order) convert(*t, s, tensors);
      w.write_shard(s, std::move(tensors));
    }
    if (rep.matrices > 0) rep.rel_err_mean /= double(rep.matrices);
  }
};

nlohmann::json repack_patch(const RepackOptions& opt, const RepackReport& rep) {
  nlohmann::json cb3 = {{"iterations", opt.iterations},
                        {"centroids_per_row", kernels::kCb3Centroids},
                        {"calibration", nullptr},
                        {"column_weights", "1 (no calibration)"}};
  if (!opt.calib.empty()) {
    cb3["calibration"] = opt.calib.filename().string();
    cb3["calib_tokens"] = rep.calib_tokens;
    cb3["column_weights"] = "mean squared input activation of the routed tokens + 1% of its mean";
  }
  return {{"experts_encoding", "cb3"}, {"repacked_from", rep.source_encoding}, {"cb3", cb3}};
}

}  // namespace

RepackReport repack_checkpoint(const fs::path& dir, const fs::path& out, const RepackOptions& opt) {
  check(opt.experts == "cb3", "--experts: '{}' is not supported (supported: cb3)", opt.experts);
  check(opt.iterations >= 0 && opt.iterations <= 1000, "--iterations: {} outside [0, 1000]",
        opt.iterations);
  require_valid(dir);
  auto ck = Checkpoint::open(dir);
  const ModelSpec cfg = model_spec(*ck);
  std::string source;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    const std::string enc = layout_name(*ck, cfg.names(), l);
    check(enc != "cb3", "{}: layer {}: experts are already cb3", dir.string(), l);
    if (source.empty()) source = enc;
  }
  DerivedCheckpointWriter w(*ck, out, opt.control);
  std::optional<CalibStats> calib;
  if (!opt.calib.empty()) {
    if (opt.log) opt.log(fmt::format("repack: calibrating on {}", opt.calib.string()));
    calib.emplace(collect_calibration(*ck, opt.calib, opt.calib_opt, opt.control));
  }
  Repacker r(*ck, cfg, opt, w);
  r.rep.source_encoding = source;
  if (calib) {
    r.calib = &*calib;
    r.rep.calib_tokens = calib->tokens();
    r.rep.calib_windows = calib->windows();
    for (int64_t l = 0; l < cfg.num_layers; ++l)
      for (int64_t e = 0; cfg.is_moe_layer(l) && e < cfg.num_experts; ++e)
        r.rep.calib_unrouted += calib->routed(l, e) == 0;
  }
  r.run();
  w.commit(derived_config(ck->config(), repack_patch(opt, r.rep)));
  return r.rep;
}

}  // namespace moetier
