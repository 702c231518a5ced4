// A stand-in for libnvidia-ml.so.1 (tests/unit/test_monitor.cpp): the NVML
// functions the monitor resolves, with fixed readings, and
// fake_nvml_configure() to make chosen calls fail or set the throttle mask.
// Built as a shared library so the test goes through dlopen/dlsym like the
// real one.
#include <cstring>

namespace {
unsigned g_fail = 0;  // bits: see fake_nvml_configure
unsigned long long g_reasons = 0;
int g_init_rc = 0;
int g_device = 0;  // the handle's target
constexpr int kError = 999;
struct Memory {
  unsigned long long total, free, used;
};
int result(unsigned bit) { return (g_fail & bit) ? kError : 0; }
}  // namespace

extern "C" {
// fail bits: 1 temperature, 2 power, 4 clock, 8 memory, 16 throttle reasons,
// 32 name, 64 driver version, 128 device handle. init_rc: nvmlInit_v2's result.
__attribute__((visibility("default"))) void fake_nvml_configure(unsigned fail,
                                                                unsigned long long reasons,
                                                                int init_rc) {
  g_fail = fail;
  g_reasons = reasons;
  g_init_rc = init_rc;
}

__attribute__((visibility("default"))) int nvmlInit_v2() { return g_init_rc; }
__attribute__((visibility("default"))) int nvmlShutdown() { return 0; }
__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = 1;
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** d) {
  if (i != 0) return kError;
  *d = &g_device;
  return result(128);
}
__attribute__((visibility("default"))) int nvmlDeviceGetName(void*, char* buf, unsigned len) {
  if (g_fail & 32) return kError;
  std::strncpy(buf, "Fake H200", len);
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetTemperature(void*, int sensor,
                                                                    unsigned* v) {
  *v = sensor == 0 ? 41 : 0;
  return result(1);
}
__attribute__((visibility("default"))) int nvmlDeviceGetPowerUsage(void*, unsigned* mw) {
  *mw = 120500;
  return result(2);
}
__attribute__((visibility("default"))) int nvmlDeviceGetClockInfo(void*, int type, unsigned* v) {
  *v = type == 1 ? 1980 : 1;
  return result(4);
}
__attribute__((visibility("default"))) int nvmlDeviceGetMemoryInfo(void*, Memory* m) {
  m->total = 150000000000ull;
  m->free = 140000000000ull;
  m->used = 10000000000ull;
  return result(8);
}
// Only the old name, as drivers before 535 export it: the loader's fallback.
__attribute__((visibility("default"))) int nvmlDeviceGetCurrentClocksThrottleReasons(
    void*, unsigned long long* r) {
  *r = g_reasons;
  return result(16);
}
__attribute__((visibility("default"))) int nvmlSystemGetDriverVersion(char* buf, unsigned len) {
  if (g_fail & 64) return kError;
  std::strncpy(buf, "580.65.06", len);
  return 0;
}
}
