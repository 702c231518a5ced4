// The monitor (src/monitor): host readings from /proc, GPU readings through a
// fake NVML (tests/support/fake_nvml.cpp, loaded with dlopen as the real one
// is), throttle decoding, and gaps where a source fails.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "monitor/host.h"
#include "monitor/monitor.h"
#include "monitor/nvml.h"

namespace moetier::monitor {
namespace {

using Configure = void (*)(unsigned, unsigned long long, int);

// Sets the fake's failures for the next calls (the library stays loaded).
void configure_fake(unsigned fail, unsigned long long reasons = 0, int init_rc = 0) {
  void* h = dlopen(MOETIER_FAKE_NVML, RTLD_NOW);
  ASSERT_NE(h, nullptr) << dlerror();
  auto f = reinterpret_cast<Configure>(dlsym(h, "fake_nvml_configure"));
  ASSERT_NE(f, nullptr);
  f(fail, reasons, init_rc);
}

std::shared_ptr<Nvml> fake(unsigned fail = 0, unsigned long long reasons = 0) {
  configure_fake(fail, reasons);
  return Nvml::open(MOETIER_FAKE_NVML);
}

TEST(MonitorHost, ProcValueParsesKeysAndKilobytes) {
  const std::string text = "MemTotal:  100 kB\nMemAvailableX: 7\nMemAvailable:   2048 kB\n";
  EXPECT_EQ(proc_value(text, "MemAvailable"), 2048u * 1024);
  EXPECT_EQ(proc_value(text, "MemTotal"), 102400u);
  EXPECT_EQ(proc_value("read_bytes: 4096\n", "read_bytes"), 4096u);
  EXPECT_FALSE(proc_value(text, "SwapFree"));
  EXPECT_FALSE(proc_value("VmRSS: lots\n", "VmRSS"));
  EXPECT_FALSE(proc_value("", "VmRSS"));
}

TEST(MonitorHost, ReadingsArePresentAndPlausible) {
  const HostReading h = read_host();
  ASSERT_TRUE(h.mem_available_bytes);
  ASSERT_TRUE(h.rss_bytes);
  EXPECT_GT(*h.mem_available_bytes, 16u << 20);
  EXPECT_LT(*h.mem_available_bytes, 1ull << 50);
  EXPECT_GT(*h.rss_bytes, 256u << 10);  // this test binary is resident
  EXPECT_LT(*h.rss_bytes, 1ull << 40);
  if (std::ifstream("/proc/self/io")) {
    EXPECT_TRUE(h.read_bytes);
  } else {
    EXPECT_FALSE(h.read_bytes) << "an unreadable /proc/self/io must be a gap";
  }
}

TEST(MonitorHost, AnUnreadableSourceIsAGap) {
  HostPaths p;
  p.meminfo = "/nonexistent/meminfo";
  const HostReading h = read_host(p);
  EXPECT_FALSE(h.mem_available_bytes);
  EXPECT_TRUE(h.rss_bytes);

  Monitor m(0, nullptr, p);
  m.sample_now();
  const auto j = m.to_json();
  ASSERT_EQ(j.size(), 1u);
  EXPECT_FALSE(j[0].contains("host_mem_available_bytes"));
  EXPECT_TRUE(j[0].contains("rss_bytes"));
}

TEST(Monitor, ManualSamplesCarryTheirPhaseInTimeOrder) {
  Monitor m(0, nullptr);
  m.sample_now();
  m.set_phase("load");
  m.sample_now();
  m.set_phase("decode");
  m.sample_now();
  const auto j = m.to_json();
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["phase"], "setup");
  EXPECT_EQ(j[1]["phase"], "load");
  EXPECT_EQ(j[2]["phase"], "decode");
  for (size_t i = 0; i < j.size(); ++i) {
    EXPECT_TRUE(j[i]["t_s"].is_number());
    if (i) {
      EXPECT_GE(j[i]["t_s"].get<double>(), j[i - 1]["t_s"].get<double>());
    }
    EXPECT_FALSE(j[i].contains("gpu_temp_c")) << "no GPU source, no GPU field";
    EXPECT_FALSE(j[i].contains("throttle"));
    EXPECT_GT(j[i]["host_mem_available_bytes"].get<double>(), 0);
  }
}

TEST(Monitor, TheSamplerThreadSamplesOnItsPeriodAndStops) {
  auto m = std::make_unique<Monitor>(0.05, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  m->set_phase("decode");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  const auto j = m->to_json();
  m.reset();  // joins at once, not after a period
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  ASSERT_GE(j.size(), 3u);
  EXPECT_LE(j.size(), 14u);  // one per 50 ms at most (plus the one at 0)
  EXPECT_EQ(j.front()["phase"], "setup");
  EXPECT_EQ(j.back()["phase"], "decode");
  for (size_t i = 1; i < j.size(); ++i)
    EXPECT_GT(j[i]["t_s"].get<double>(), j[i - 1]["t_s"].get<double>());
}

TEST(MonitorNvml, AbsentOrIncompleteLibrariesAreUnavailableWithAReason) {
  auto none = Nvml::open("/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(none->available());
  EXPECT_NE(none->problem().find("cannot load /nonexistent/libnvidia-ml.so.1"), std::string::npos);
  EXPECT_FALSE(none->read(0).temp_c);
  EXPECT_TRUE(gpu_identity(*none).empty());

  auto libc = Nvml::open("libc.so.6");
  EXPECT_FALSE(libc->available());
  EXPECT_NE(libc->problem().find("lacks nvmlInit_v2"), std::string::npos);

  configure_fake(0, 0, 3);
  auto no_init = Nvml::open(MOETIER_FAKE_NVML);
  EXPECT_FALSE(no_init->available());
  EXPECT_NE(no_init->problem().find("nvmlInit_v2 failed (NVML error 3)"), std::string::npos);
  Monitor m(0, no_init);
  m.sample_now();
  EXPECT_FALSE(m.to_json()[0].contains("gpu_power_w"));
}

TEST(MonitorNvml, FakeGpuFieldsAndThrottleDecoding) {
  auto n = fake(0, 0x4 | 0x40);
  ASSERT_TRUE(n->available()) << n->problem();
  EXPECT_EQ(n->device_count(), 1u);
  Monitor m(0, n);
  m.set_phase("prefill");
  m.sample_now();
  const auto s = m.to_json().at(0);
  EXPECT_EQ(s["phase"], "prefill");
  EXPECT_EQ(s["gpu_temp_c"].get<double>(), 41);
  EXPECT_DOUBLE_EQ(s["gpu_power_w"].get<double>(), 120.5);
  EXPECT_EQ(s["gpu_sm_clock_mhz"].get<double>(), 1980);
  EXPECT_EQ(s["gpu_mem_used_bytes"].get<uint64_t>(), 10000000000ull);
  EXPECT_EQ(s["gpu_mem_free_bytes"].get<uint64_t>(), 140000000000ull);
  EXPECT_EQ(s["throttle"], nlohmann::json({"sw_power_cap", "hw_thermal"}));
  EXPECT_TRUE(s.contains("rss_bytes"));

  configure_fake(0, 0);
  m.sample_now();
  EXPECT_EQ(m.to_json().at(1)["throttle"], nlohmann::json::array()) << "measured: no reason";
}

TEST(MonitorNvml, ThrottleNamesKeepPowerCapApartFromThermal) {
  EXPECT_EQ(throttle_names(0), std::vector<std::string>{});
  EXPECT_EQ(throttle_names(0x4), std::vector<std::string>{"sw_power_cap"});
  EXPECT_EQ(throttle_names(0x20 | 0x40), (std::vector<std::string>{"sw_thermal", "hw_thermal"}));
  EXPECT_EQ(throttle_names(0x1 | 0x8 | 0x80),
            (std::vector<std::string>{"gpu_idle", "hw_slowdown", "hw_power_brake"}));
  EXPECT_EQ(throttle_names(0x200), std::vector<std::string>{"other_0x200"});
}

TEST(MonitorNvml, AFailedCallIsAGapNotAValue) {
  Monitor m(0, fake(1 | 16));  // temperature and throttle reasons fail
  m.sample_now();
  auto s = m.to_json().at(0);
  EXPECT_FALSE(s.contains("gpu_temp_c"));
  EXPECT_FALSE(s.contains("throttle"));
  EXPECT_TRUE(s.contains("gpu_power_w"));
  EXPECT_TRUE(s.contains("gpu_mem_free_bytes"));

  configure_fake(2 | 4 | 8);
  m.sample_now();
  s = m.to_json().at(1);
  EXPECT_TRUE(s.contains("gpu_temp_c"));
  EXPECT_FALSE(s.contains("gpu_power_w"));
  EXPECT_FALSE(s.contains("gpu_sm_clock_mhz"));
  EXPECT_FALSE(s.contains("gpu_mem_used_bytes"));
  EXPECT_FALSE(s.contains("gpu_mem_free_bytes"));

  configure_fake(128);  // no device handle: no GPU field at all
  m.sample_now();
  s = m.to_json().at(2);
  for (const char* k : {"gpu_temp_c", "gpu_power_w", "gpu_sm_clock_mhz", "throttle"})
    EXPECT_FALSE(s.contains(k)) << k;
  EXPECT_TRUE(s.contains("host_mem_available_bytes"));
}

TEST(MonitorNvml, GpuIdentityForTheMachineSection) {
  const auto id = gpu_identity(*fake());
  EXPECT_EQ(id["gpu"], "Fake H200");
  EXPECT_EQ(id["gpu_memory_bytes"].get<uint64_t>(), 150000000000ull);
  EXPECT_EQ(id["driver"], "580.65.06");
  EXPECT_EQ(id["gpu_count"], 1);
  const auto partial = gpu_identity(*fake(32 | 64));
  EXPECT_FALSE(partial.contains("gpu"));
  EXPECT_FALSE(partial.contains("driver"));
  EXPECT_TRUE(partial.contains("gpu_memory_bytes"));
}

TEST(MonitorNvml, TheEnvironmentNamesTheLibrary) {
  configure_fake(0);
  ::setenv("MOETIER_NVML_LIB", MOETIER_FAKE_NVML, 1);
  auto n = Nvml::open();
  ::unsetenv("MOETIER_NVML_LIB");
  EXPECT_TRUE(n->available()) << n->problem();
}

}  // namespace
}  // namespace moetier::monitor
