// The arena on a device backend (the staged path: reads land in host staging,
// are validated there and copied with to_device; the host tier moves with
// to_device / to_host), run on the CPU through DeviceDouble, whose device
// memory the host cannot dereference. The bit-identical arena test (with and
// without random prefetch) and the fault tests hold through it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "cpu_reference.h"
#include "device_double.h"
#include "experts/arena_experts.h"
#include "experts/options.h"
#include "format/safetensors.h"
#include "io/fault.h"
#include "model/architecture.h"
#include "prefetch_fixture.h"
#include "runtime/mapped_experts.h"

using namespace moetier;
using namespace moetier::testing;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const char* name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}

struct FaultGuard {
  ~FaultGuard() { io::FaultInjector::global().disarm(); }
};

// An arena on the device double over one fixture.
struct Rig {
  DeviceDouble dev;
  std::unique_ptr<Checkpoint> ck;
  ModelSpec cfg;
  ExpertStats stats;
  std::unique_ptr<ArenaExperts> arena;
  explicit Rig(const fs::path& dir, size_t hot = 6, size_t ring = 4, size_t host = 2) {
    ck = Checkpoint::open(dir);
    cfg = model_spec(*ck);
    ArenaConfig ac;
    ac.hot_slots = hot;
    ac.transient_slots = ring;
    ac.host_slots = host;
    ac.backend = &dev;
    arena = std::make_unique<ArenaExperts>(ExpertIndex::build(*ck, cfg), ac, &stats);
  }
  // The expert's gate weight bytes as the mmap sees them, and as the device holds them.
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
  std::vector<std::byte> gate_dev(const ExpertView& v, size_t n) {
    EXPECT_TRUE(DeviceDouble::is_device(v.gate.data));
    std::vector<std::byte> out(n);
    dev.to_host(out.data(), v.gate.data, n);
    return out;
  }
};

std::string acquire_error(ArenaExperts& a, int64_t layer, std::vector<int32_t> ids, Phase ph) {
  std::vector<ExpertView> v;
  try {
    a.acquire(layer, ids, ph, v);
  } catch (const Error& e) {
    EXPECT_TRUE(v.empty());
    return e.what();
  }
  a.release_acquired();
  return {};
}

}  // namespace

TEST(ExpertDevice, ArenaOnTheDeviceEqualsAllResident) {
  uint32_t seed = 500;
  for (const char* name : kGreedyFixtures) {
    const CpuReference cr = cpu_reference(name, 13, seed++, 8);
    const Checkpoint& ck = *cr.ck;
    const ModelSpec& cfg = cr.spec();
    const GreedyRun& ref = cr.run;
    const auto& prompt = cr.prompt;
    DeviceDouble dev;
    const std::unique_ptr<Model> model = load_model(ck, dev);
    struct Variant {
      const char* arena;
      int64_t transient;
      const char* host;
      bool prefetch;
    };
    for (const Variant& v : {Variant{"10%", -1, "", false}, Variant{"10%", 3, "64KiB", false},
                             Variant{"10%", 2, "64KiB", true}, Variant{"100%", -1, "", false}}) {
      const std::string what = std::string(name) + " arena " + v.arena + " transient " +
                               std::to_string(v.transient) + " host '" + v.host + "'" +
                               (v.prefetch ? " prefetch" : "");
      ExpertOptions o;
      o.arena = v.arena;
      o.transient = v.transient;
      o.host_cache = v.host;
      o.quiet = true;
      ExpertStats stats;
      auto arena = make_expert_provider(ck, cfg, o, &stats, nullptr, &dev);
      ASSERT_TRUE(arena->device_slots());
      const uint64_t copied = dev.to_device_bytes();
      if (v.prefetch) {
        RandomPrefetch hinted(*arena, seed++);
        expect_identical_runs(ref, greedy_run(*model, hinted, prompt, 8), what);
      } else {
        expect_identical_runs(ref, greedy_run(*model, *arena, prompt, 8), what);
      }
      arena->drain();
      const LayerCounters t = stats.total();
      EXPECT_EQ(t.hits() + t.misses, t.uses) << what;
      EXPECT_GE(dev.to_device_bytes() - copied, t.read_bytes) << what;  // every read was copied
      if (*v.host) {
        EXPECT_GT(stats.host_copy_bytes, 0u) << what;
      }
    }
  }
}

TEST(ExpertDevice, FaultsFailTheRequestAndTheNextOneWorks) {
  FaultGuard guard;
  for (const char* name : {"qwen3moe-bf16", "qwen3moe-mxfp4", "qwen3moe-sharded"}) {
    for (io::FaultKind kind : {io::FaultKind::ShortRead, io::FaultKind::Eio,
                               io::FaultKind::Truncate, io::FaultKind::Corrupt}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(io::fault_kind_name(kind)));
      Rig s(fixture(name));
      std::vector<ExpertView> v;
      std::vector<int32_t> warm{0, 1};
      s.arena->acquire(0, warm, Phase::Decode, v);
      s.arena->release_acquired();
      io::FaultSpec spec;
      spec.kind = kind;
      spec.size = 4096;
      if (kind == io::FaultKind::Corrupt) spec.count = 0;
      io::FaultInjector::global().arm(spec);
      std::string err = acquire_error(*s.arena, 0, {5, 0, 6}, Phase::Decode);
      io::FaultInjector::global().disarm();
      ASSERT_FALSE(err.empty());
      EXPECT_EQ(err.find('\n'), std::string::npos) << err;
      EXPECT_NE(err.find(".safetensors"), std::string::npos) << err;
      EXPECT_NE(err.find("layer 0 expert"), std::string::npos) << err;
      if (kind == io::FaultKind::Corrupt) {
        EXPECT_NE(err.find("fail validation"), std::string::npos) << err;  // checked on staging
      }
      EXPECT_EQ(s.stats.failed_acquires, 1u);
      EXPECT_EQ(s.arena->residency().where(s.arena->index().key(0, 5)), Tier::Storage);
      EXPECT_EQ(s.arena->residency().where(s.arena->index().key(0, 0)), Tier::Hot);
      EXPECT_EQ(s.stats.total().uses, 2u);
      std::vector<int32_t> again{5, 0, 6};
      s.arena->acquire(0, again, Phase::Decode, v);
      for (size_t i = 0; i < again.size(); ++i) {
        auto ref = s.gate_ref(0, again[i]);
        ASSERT_EQ(s.gate_dev(v[i], ref.size()), ref);
      }
      s.arena->release_acquired();
    }
  }
}

TEST(ExpertDevice, HostTierAndPressureKeepTheBytes) {
  Rig s(fixture("qwen3moe-mxfp4"), 4, 2, 6);
  std::vector<ExpertView> v;
  for (int i = 0; i < 60; ++i) {  // evictions spill to the host tier; hits copy back
    std::vector<int32_t> ids{int32_t((i * 7) % 5), int32_t((i * 7 + 3) % 5)};
    s.arena->acquire(i % 2, ids, i % 5 ? Phase::Decode : Phase::Prefill, v);
    for (size_t j = 0; j < ids.size(); ++j) {
      auto ref = s.gate_ref(i % 2, ids[j]);
      ASSERT_EQ(s.gate_dev(v[j], ref.size()), ref) << i;
    }
  }
  s.arena->release_acquired();
  EXPECT_GT(s.stats.total().hits_host, 0u);
  EXPECT_GT(s.stats.host_copy_bytes, 0u);
}

TEST(ExpertDevice, InvalidBytesOnDiskAreRefused) {
  const fs::path dir = fs::temp_directory_path() / ("moetier_device_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(fixture("qwen3moe-mxfp4"), dir, fs::copy_options::recursive);
  std::string tensor;
  {
    auto ck = Checkpoint::open(dir);
    auto cfg = model_spec(*ck);
    tensor = expert_tensors(*ck, cfg, 0, 3).up_scale;
    const uint64_t offset = ck->file_offset(ck->get(tensor)) + 6;
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(offset));
    f.put('\xff');  // a NaN e8m0 scale
  }
  {
    Rig s(dir);
    std::string err = acquire_error(*s.arena, 0, {2, 3}, Phase::Prefill);
    EXPECT_NE(err.find("tensor '" + tensor + "'"), std::string::npos) << err;
    EXPECT_NE(err.find("element 6 is 0xff"), std::string::npos) << err;
    EXPECT_TRUE(acquire_error(*s.arena, 0, {2, 4}, Phase::Prefill).empty());
  }
  fs::remove_all(dir);
}
