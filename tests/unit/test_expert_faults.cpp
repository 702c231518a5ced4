// experts/ + io/: every storage fault fails the acquire that hit it with a
// one-line error, hands no bytes to compute, and leaves the provider usable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "experts/arena_experts.h"
#include "format/safetensors.h"
#include "io/fault.h"
#include "model/architecture.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

// A private copy of a fixture (so that tests may damage it).
struct Copy {
  fs::path dir;
  explicit Copy(const char* name) {
    dir = fs::temp_directory_path() / ("moetier_faults_" + std::to_string(getpid()) + "_" + name);
    fs::remove_all(dir);
    fs::copy(fixture(name), dir, fs::copy_options::recursive);
  }
  ~Copy() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

struct Rig {
  std::unique_ptr<Checkpoint> ck;
  ModelSpec cfg;
  ExpertStats stats;
  std::unique_ptr<ArenaExperts> arena;
  explicit Rig(const fs::path& dir, size_t hot = 6, size_t ring = 4) {
    ck = Checkpoint::open(dir);
    cfg = model_spec(*ck);
    ArenaConfig ac;
    ac.hot_slots = hot;
    ac.transient_slots = ring;
    arena = std::make_unique<ArenaExperts>(ExpertIndex::build(*ck, cfg), ac, &stats);
  }
  // The expert's gate weight bytes as the mmap sees them.
  std::vector<std::byte> gate_ref(int64_t layer, int32_t e) {
    ExpertTensors t = expert_tensors(*ck, cfg, layer, e);
    auto b = ck->bytes(ck->get(t.gate));
    uint64_t n = b.size();
    if (t.layout == ExpertLayout::Stacked) {
      n = uint64_t(cfg.expert_intermediate * cfg.hidden_size) * 2;
      b = b.subspan(uint64_t(e) * 2 * n, n);
    }
    return {b.begin(), b.end()};
  }
};

struct FaultGuard {
  ~FaultGuard() { io::FaultInjector::global().disarm(); }
};

std::string acquire_error(ArenaExperts& a, int64_t layer, std::vector<int32_t> ids, Phase ph) {
  std::vector<ExpertView> v;
  try {
    a.acquire(layer, ids, ph, v);
  } catch (const Error& e) {
    EXPECT_TRUE(v.empty());
    return e.what();
  }
  return {};
}

}  // namespace

TEST(ExpertFaults, InjectedFaultsFailTheRequestAndTheNextOneWorks) {
  FaultGuard guard;
  for (const char* name : {"qwen3moe-bf16", "qwen3moe-mxfp4", "qwen3moe-sharded"}) {
    for (io::FaultKind kind : {io::FaultKind::ShortRead, io::FaultKind::Eio,
                               io::FaultKind::Truncate, io::FaultKind::Corrupt}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(io::fault_kind_name(kind)));
      Rig s(fixture(name));
      std::vector<ExpertView> v;
      std::vector<int32_t> warm{0, 1};
      s.arena->acquire(0, warm, Phase::Decode, v);  // resident before the fault
      io::FaultSpec spec;
      spec.kind = kind;
      spec.size = 4096;  // truncate: everything past the first page is gone
      // MXFP4 weight bytes have no invalid values: corrupt every read of the
      // batch so that the scales are hit as well.
      if (kind == io::FaultKind::Corrupt) spec.count = 0;
      io::FaultInjector::global().arm(spec);
      std::string err = acquire_error(*s.arena, 0, {5, 0, 6}, Phase::Decode);
      ASSERT_FALSE(err.empty());
      EXPECT_EQ(err.find('\n'), std::string::npos) << err;
      EXPECT_NE(err.find(".safetensors"), std::string::npos) << err;
      EXPECT_NE(err.find("layer 0 expert"), std::string::npos) << err;
      if (kind == io::FaultKind::Corrupt) {
        EXPECT_NE(err.find("fail validation"), std::string::npos) << err;
        EXPECT_NE(err.find("tensor 'model.layers.0.mlp.experts."), std::string::npos) << err;
      }
      io::FaultInjector::global().disarm();
      EXPECT_EQ(s.stats.failed_acquires, 1u);
      EXPECT_EQ(s.stats.last_error, err);
      EXPECT_EQ(s.arena->residency().where(s.arena->index().key(0, 5)), Tier::Storage);
      EXPECT_EQ(s.arena->residency().where(s.arena->index().key(0, 0)), Tier::Hot);
      // Only the successful acquire was counted.
      EXPECT_EQ(s.stats.total().uses, 2u);
      EXPECT_EQ(s.stats.total().misses, 2u);
      // The engine is usable: the same request now succeeds with the right bytes.
      std::vector<int32_t> again{5, 0, 6};
      s.arena->acquire(0, again, Phase::Decode, v);
      for (size_t i = 0; i < again.size(); ++i) {
        auto ref = s.gate_ref(0, again[i]);
        ASSERT_EQ(std::memcmp(v[i].gate.data, ref.data(), ref.size()), 0);
      }
      LayerCounters t = s.stats.total();
      EXPECT_EQ(t.hits() + t.misses, t.uses);
      EXPECT_EQ(t.uses, 5u);
    }
  }
}

TEST(ExpertFaults, ShardTruncatedAfterStart) {
  Copy c("qwen3moe-sharded");
  Rig s(c.dir, 8, 4);
  std::vector<ExpertView> v;
  std::vector<int32_t> early{0};
  s.arena->acquire(1, early, Phase::Decode, v);
  auto ref0 = s.gate_ref(1, 0);
  // Cut every shard in half: experts stored past the cut can no longer be read.
  for (const Shard& sh : s.ck->shards()) fs::resize_file(sh.path, sh.file_size / 2);
  int failed = 0, served = 0;
  for (int32_t e = 0; e < s.cfg.num_experts; ++e) {
    std::string err = acquire_error(*s.arena, 0, {e}, Phase::Decode);
    if (err.empty()) {
      ++served;
    } else {
      ++failed;
      EXPECT_NE(err.find("short read"), std::string::npos) << err;
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(served, 0);
  EXPECT_EQ(s.stats.failed_acquires, uint64_t(failed));
  // The expert read before the truncation is still resident and intact.
  s.arena->acquire(1, early, Phase::Decode, v);
  EXPECT_EQ(std::memcmp(v[0].gate.data, ref0.data(), ref0.size()), 0);
}

TEST(ExpertFaults, InvalidBytesOnDiskAreRefused) {
  for (const char* name : {"qwen3moe-mxfp4", "qwen3moe-bf16"}) {
    Copy c(name);
    std::string tensor;
    uint64_t offset = 0;
    {
      auto ck = Checkpoint::open(c.dir);
      auto cfg = model_spec(*ck);
      ExpertTensors t = expert_tensors(*ck, cfg, 0, 3);
      tensor = t.layout == ExpertLayout::PerExpertMxfp4 ? t.up_scale : t.down;
      const TensorInfo& ti = ck->get(tensor);
      offset = ck->file_offset(ti) + 7;  // one byte (MXFP4 scale) or element half (bf16)
      if (t.layout == ExpertLayout::Stacked) {
        offset =
            ck->file_offset(ti) + uint64_t(3 * cfg.hidden_size * cfg.expert_intermediate) * 2 + 7;
      }
    }
    {
      std::fstream f(c.dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(offset - 1));
      const char ff[2] = {'\xff', '\xff'};
      f.write(ff, 2);  // a NaN scale, or a bf16 NaN (0xffff) at element 3
    }
    Rig s(c.dir);
    std::string err = acquire_error(*s.arena, 0, {2, 3}, Phase::Prefill);
    EXPECT_NE(err.find("tensor '" + tensor + "'"), std::string::npos) << err;
    EXPECT_NE(err.find("fail validation"), std::string::npos) << err;
    EXPECT_NE(err.find("expert 3"), std::string::npos) << err;
    // bytes 6 and 7 of the expert's tensor: bf16 element 3, or the scale byte at 6
    bool fp4 = std::string(name) == "qwen3moe-mxfp4";
    EXPECT_NE(err.find(fp4 ? "element 6 is 0xff" : "element 3 is NaN/Inf"), std::string::npos)
        << err;
    std::vector<ExpertView> v;
    std::vector<int32_t> fine{2, 4};
    s.arena->acquire(0, fine, Phase::Prefill, v);
    EXPECT_EQ(v.size(), 2u);
    EXPECT_THROW(s.arena->acquire(0, std::vector<int32_t>{3}, Phase::Decode, v), Error);
  }
}
