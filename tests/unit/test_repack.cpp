// moetier repack --experts cb3: the output passes check, is detected as CB3,
// runs through MappedExperts and the arena store alike (bit-identical), and
// computes exactly the model whose experts are the decoded CB3 matrices; its
// logits stay close to the source's (relative error measured and printed);
// calibration runs and changes the fit; bad input and failures midway leave
// no output directory.
#include <gtest/gtest.h>

#include <cstring>

#include "convert/calib.h"
#include "convert/repack.h"
#include "convert_fixture.h"
#include "core/error.h"
#include "experts/index.h"
#include "experts/options.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"
#include "model/check.h"

using namespace moetier;
using namespace moetier::testing;

namespace {

// A copy of the CB3 checkpoint `dir` with every expert matrix decoded to f32
// (per-expert layout): the model the CB3 kernels must compute.
void write_decoded(const fs::path& dir, const fs::path& out) {
  auto ck = Checkpoint::open(dir);
  const ModelSpec c = config_of(dir);
  std::vector<TensorToWrite> tensors;
  for (const auto& t : ck->tensors())
    if (t.name.find(".mlp.experts.") == std::string::npos)
      tensors.push_back({t.name, t.dtype, t.shape, ck->bytes(t)});
  std::vector<std::vector<float>> store;
  store.reserve(size_t(c.num_layers * c.num_experts * 3));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t e = 0; c.is_moe_layer(l) && e < c.num_experts; ++e) {
      const ExpertView v = map_expert(*ck, c, l, e);
      const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
      const MatView* m[3] = {&v.gate, &v.up, &v.down};
      for (int p = 0; p < 3; ++p) {
        EXPECT_EQ(m[p]->enc, WeightEncoding::CB3);
        auto& f = store.emplace_back(size_t(m[p]->rows * m[p]->cols));
        for (int64_t r = 0; r < m[p]->rows; ++r)
          for (int64_t col = 0; col < m[p]->cols; ++col)
            f[size_t(r * m[p]->cols + col)] = ref::weight_at(*m[p], r, col);
        tensors.push_back({fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", l, e, names[p]),
                           DType::F32,
                           {m[p]->rows, m[p]->cols},
                           std::as_bytes(std::span<const float>(f))});
      }
    }
  }
  write_checkpoint(out, ck->config(), {tensors});
}

RepackReport repack(const fs::path& src, const fs::path& out, const fs::path& calib = {}) {
  RepackOptions o;
  o.calib = calib;
  o.calib_opt.max_tokens = 512;
  o.calib_opt.window = 64;
  return repack_checkpoint(src, out, o);
}

}  // namespace

// Every source layout (stacked bf16, per-expert bf16 sharded, MXFP4, and a
// written stacked fixture whose sizes are not multiples of 8).
TEST(Repack, Cb3RunsAndComputesTheDecodedModel) {
  TempDir tmp;
  Tiny t;
  t.hidden = 60;
  t.moe_inter = 20;
  write_tiny(tmp / "odd", t);
  for (const fs::path& src : {golden("qwen3moe-bf16"), golden("qwen3moe-sharded"),
                              golden("qwen3moe-mxfp4"), tmp / "odd"}) {
    const std::string name = src.filename().string();
    const fs::path out = tmp / ("cb3-" + name), dec = tmp / ("dec-" + name);
    const RepackReport r = repack(src, out);
    EXPECT_EQ(check_checkpoint(out), std::vector<std::string>{}) << name;
    EXPECT_GT(r.matrices, 0);
    const ModelSpec sc = config_of(src);
    int64_t moe = 0;
    for (int64_t l = 0; l < sc.num_layers; ++l) moe += sc.is_moe_layer(l);
    const int64_t H = sc.hidden_size, I = sc.expert_intermediate;
    const int64_t per_expert = 2 * I * ((3 * H + 7) / 8 + 16) + H * ((3 * I + 7) / 8 + 16);
    EXPECT_EQ(r.expert_bytes_after, uint64_t(moe * sc.num_experts * per_expert)) << name;
    EXPECT_GT(r.rel_err_mean, 0.0);
    EXPECT_LT(r.rel_err_max, 0.06) << name;  // Gaussian-like weights: ~0.035
    auto ck = Checkpoint::open(out);
    const ModelSpec c = config_of(out);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      if (c.is_moe_layer(l)) {
        EXPECT_EQ(detect_expert_layout(*ck, MoeTensorNames{}, l), ExpertLayout::PerExpertCb3);
      }
    }
    write_decoded(out, dec);
    const auto toks = random_tokens(c.vocab_size, 9, 5);
    const auto a = prefill_logits(src, toks), b = prefill_logits(out, toks),
               d = prefill_logits(dec, toks);
    EXPECT_LT(max_rel_diff(b, d), 1e-5) << name;  // the kernels compute the decoded model
    const double rel = max_rel_diff(b, a);
    std::printf(
        "%s: cb3 vs source: max rel logit diff %.3g; weight rel sq err mean %.4f max %.4f; "
        "expert bytes %llu -> %llu\n",
        name.c_str(), rel, r.rel_err_mean, r.rel_err_max, (unsigned long long)r.expert_bytes_before,
        (unsigned long long)r.expert_bytes_after);
    EXPECT_LT(rel, 0.3) << name;
  }
}

// The arena store reads cb3 records in place (one 4 KiB-aligned extent per
// expert) and changes nothing, bit for bit.
TEST(Repack, ArenaEqualsMappedOnCb3) {
  TempDir tmp;
  repack(golden("qwen3moe-mxfp4"), tmp / "cb3");
  auto ck = Checkpoint::open(tmp / "cb3");
  const std::unique_ptr<Model> model_owned = load_model(*ck);
  const Model& model = *model_owned;
  const ModelSpec& c = model.spec();
  const ExpertIndex ix = ExpertIndex::build(*ck, c);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const ExpertRecord& r = ix.record(l, e);
      ASSERT_EQ(r.extents.size(), 1u);
      EXPECT_EQ(r.extents[0].offset % 4096, 0u);
      EXPECT_EQ(r.slot_bytes, (r.bytes + 4095) / 4096 * 4096);
      EXPECT_EQ(ix.shape(l, ExpertPart::DownW).enc, WeightEncoding::CB3);
    }
  }
  const auto prompt = random_tokens(c.vocab_size, 12, 8);
  MappedExperts mapped(*ck, c);
  ExpertOptions o;
  o.arena = "10%";
  o.quiet = true;
  ExpertStats stats;
  auto arena = make_expert_provider(*ck, c, o, &stats);
  ForwardOptions all;
  all.all_logits = true;
  auto k1 = model.new_state(16), k2 = model.new_state(16);
  const auto a = model.forward(prompt, 0, *k1, mapped, all);
  const auto b = model.forward(prompt, 0, *k2, *arena, all);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  EXPECT_GT(stats.total().misses, 0u);
  // A NaN planted in a codebook is caught when the expert is loaded.
  const TensorInfo& cb = ck->get("model.layers.1.mlp.experts.3.up_proj.codebook");
  std::vector<std::byte> slot(ix.slot_bytes());
  EXPECT_EQ(ix.validate(ix.key(1, 3), slot.data()), "");
  const ByteRange* part = nullptr;
  for (const ByteRange& br : ix.record(1, 3).ranges)
    if (br.tensor == cb.name) part = &br;
  ASSERT_NE(part, nullptr);
  slot[part->slot_offset + 5] = std::byte{0x7e};  // f16 0x7eXX: NaN
  EXPECT_NE(ix.validate(ix.key(1, 3), slot.data()).find("cb3 codebook"), std::string::npos);
}

// Calibration on a corpus: tokens are counted, the config says so, and the
// fit changes (per-column weights); on moetier-tiny the calibrated repack is
// measured against the plain one on the calibration text itself.
TEST(Repack, CalibrationWeightsTheFit) {
  TempDir tmp;
  const int threads = cpu::threads();
  cpu::set_threads(1);  // whole-model work: one thread is fastest on a shared machine
  const fs::path corpus = fs::path(MOETIER_SOURCE_DIR) / "tests/data/moetier-tiny/eval_prose.txt";
  const RepackReport plain = repack(tiny_model(), tmp / "plain");
  const RepackReport cal = repack(tiny_model(), tmp / "cal", corpus);
  EXPECT_EQ(cal.calib_tokens, 512);
  EXPECT_EQ(cal.calib_windows, 8);
  EXPECT_EQ(check_checkpoint(tmp / "cal"), std::vector<std::string>{});
  const auto cfg = read_json(tmp / "cal/config.json");
  EXPECT_EQ(cfg["moetier"]["cb3"]["calibration"], "eval_prose.txt");
  EXPECT_EQ(cfg["moetier"]["repacked_from"], "mxfp4");
  auto a = Checkpoint::open(tmp / "plain"), b = Checkpoint::open(tmp / "cal");
  const auto x = a->bytes(a->get("model.layers.2.mlp.experts.5.gate_proj.codebook"));
  const auto y = b->bytes(b->get("model.layers.2.mlp.experts.5.gate_proj.codebook"));
  EXPECT_NE(std::memcmp(x.data(), y.data(), x.size()), 0);
  // In-sample logit error on the calibration tokens.
  const Tokenizer tok = Tokenizer::load(tiny_model());
  std::vector<int32_t> ids = tok.encode(read_file(corpus), false);
  ids.resize(64);
  const auto ref = prefill_logits(tiny_model(), ids);
  const auto lp = prefill_logits(tmp / "plain", ids), lc = prefill_logits(tmp / "cal", ids);
  const double e_plain = rms_rel_diff(lp, ref), e_cal = rms_rel_diff(lc, ref);
  std::printf(
      "moetier-tiny cb3 on 64 calibration tokens: rms rel logit diff plain %.4f, "
      "calibrated %.4f (max %.4f, %.4f); unrouted experts %lld\n",
      e_plain, e_cal, max_rel_diff(lp, ref), max_rel_diff(lc, ref), (long long)cal.calib_unrouted);
  EXPECT_LT(e_cal, e_plain);  // in sample, the weighted fit must help
  EXPECT_LT(e_plain, 0.3);
  cpu::set_threads(threads);
}

TEST(Repack, CalibStatsFallbacks) {
  CalibStats s(2, 3, 4, 2);
  const float xn[8] = {1, 2, 3, 4, 1, 2, 3, 4};  // [2, 4]
  s.add_layer(0, xn, 2);
  const float h[4] = {1, 0, 3, 0};  // [2, 2]
  s.add_expert(0, 1, xn, h, 2);
  EXPECT_EQ(s.routed(0, 1), 2);
  EXPECT_EQ(s.routed(0, 0), 0);
  const auto w = s.weights(0, 1, false);  // mean x^2 = 1, 4, 9, 16 (+1% of 7.5)
  EXPECT_NEAR(w[0], 1.075f, 1e-5);
  EXPECT_NEAR(w[3], 16.075f, 1e-4);
  const auto d = s.weights(0, 1, true);  // mean h^2 = 5, 0 (+0.025)
  EXPECT_NEAR(d[0], 5.025f, 1e-5);
  EXPECT_NEAR(d[1], 0.025f, 1e-6);
  EXPECT_EQ(s.weights(0, 0, false), w);  // unrouted: the layer's mean (same tokens here)
  EXPECT_EQ(s.weights(0, 0, true), std::vector<float>(2, 1.0f));   // unrouted down: unit
  EXPECT_EQ(s.weights(1, 2, false), std::vector<float>(4, 1.0f));  // no data at all
}

TEST(Repack, BadInputAndFailuresLeaveNothing) {
  TempDir tmp;
  const fs::path src = golden("qwen3moe-mxfp4");
  repack(src, tmp / "cb3");
  fs::create_directory(tmp / "exists");
  write_file(tmp / "empty.txt", "");
  struct Case {
    std::string args, env, expect;
  };
  const std::string o = " -o " + (tmp / "out").string();
  for (const Case& k : {
           Case{src.string() + " --experts fp8" + o, "", "'fp8' is not supported"},
           Case{(tmp / "cb3").string() + " --experts cb3" + o, "", "already cb3"},
           Case{src.string() + " --experts cb3 --calib " + (tmp / "none.txt").string() + o, "",
                "no such file"},
           Case{src.string() + " --experts cb3 --calib " + (tmp / "empty.txt").string() + o, "",
                "encodes to no tokens"},
           Case{src.string() + " --experts cb3 --calib-tokens 0 --calib " +
                    (tmp / "exists").string() + o,
                "", "--calib"},
           Case{src.string() + " --experts cb3 -o " + (tmp / "exists").string(), "",
                "already exists"},
           Case{src.string() + " --experts cb3" + o, "MOETIER_CONVERT_FAULT=error:20 ",
                "injected fault"},
           Case{src.string() + " --experts cb3" + o, "MOETIER_CONVERT_FAULT=sigint:20 ",
                "interrupted"},
       }) {
    const CliResult r = run_cli("repack " + k.args, k.env);
    EXPECT_EQ(r.rc, 1) << k.args << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(k.expect), std::string::npos) << r.err;
    EXPECT_EQ(leftovers(tmp.path(), "out"), std::vector<std::string>{}) << k.args;
  }
  RepackOptions opt;
  opt.control.fail_after = 3;
  EXPECT_THROW(repack_checkpoint(src, tmp / "out", opt), Error);
  EXPECT_EQ(leftovers(tmp.path(), "out"), std::vector<std::string>{});
  const CliResult ok = run_cli("repack " + src.string() + " --experts cb3" + o);
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_NE(ok.out.find("-> cb3"), std::string::npos) << ok.out;
  EXPECT_EQ(run_cli("check " + (tmp / "out").string()).rc, 0);
}

// moetier check knows the cb3 layout: wrong dtypes and shapes, and a
// codebook in a layer of another encoding, are reported by name.
TEST(Repack, CheckReportsCb3Problems) {
  TempDir tmp;
  repack(golden("qwen3moe-mxfp4"), tmp / "cb3");
  copy_dir(tmp / "cb3", tmp / "bad");
  RawShard raw = read_raw(tmp / "bad/model.safetensors");
  raw.header["model.layers.0.mlp.experts.4.up_proj.codebook"]["dtype"] = "BF16";
  auto& w = raw.header["model.layers.1.mlp.experts.2.down_proj.weight"];
  w["shape"] = {w["shape"][1], w["shape"][0]};  // same bytes, transposed shape
  write_raw(tmp / "bad/model.safetensors", raw);
  const auto problems = check_checkpoint(tmp / "bad");
  ASSERT_EQ(problems.size(), 2u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("experts.4.up_proj.codebook': dtype BF16, expected F16"),
            std::string::npos)
      << problems[0];
  EXPECT_NE(problems[1].find("experts.2.down_proj.weight': shape [24, 64], expected [64, 24]"),
            std::string::npos)
      << problems[1];
  // A codebook among MXFP4 experts.
  copy_dir(golden("qwen3moe-mxfp4"), tmp / "stray");
  RawShard m = read_raw(tmp / "stray/model.safetensors");
  const std::string scale = "model.layers.0.mlp.experts.3.gate_proj.scale";
  m.header["model.layers.0.mlp.experts.3.gate_proj.codebook"] = m.header[scale];
  m.header.erase(scale);
  write_raw(tmp / "stray/model.safetensors", m);
  const auto p2 = check_checkpoint(tmp / "stray");
  bool found = false;
  for (const auto& p : p2) found |= p.find("a cb3 codebook") != std::string::npos;
  EXPECT_TRUE(found) << ::testing::PrintToString(p2);
}
