#include "monitor/nvml.h"

#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace moetier::monitor {

// NVML's C types as its ABI has them: nvmlReturn_t is an int enum (0 =
// NVML_SUCCESS), nvmlDevice_t an opaque pointer, nvmlMemory_t (v1) three
// unsigned long long in the order total, free, used.
namespace {
using Device = void*;
struct Memory {
  unsigned long long total, free, used;
};
constexpr int kSuccess = 0;
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM
}  // namespace

struct Nvml::Api {
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, Device*) = nullptr;
  int (*name)(Device, char*, unsigned) = nullptr;
  int (*temperature)(Device, int, unsigned*) = nullptr;
  int (*power)(Device, unsigned*) = nullptr;  // milliwatts
  int (*clock)(Device, int, unsigned*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  int (*reasons)(Device, unsigned long long*) = nullptr;
  int (*driver)(char*, unsigned) = nullptr;
};

std::vector<std::string> throttle_names(uint64_t mask) {
  static constexpr std::array<const char*, 9> kNames = {
      "gpu_idle",   "applications_clocks", "sw_power_cap",   "hw_slowdown",   "sync_boost",
      "sw_thermal", "hw_thermal",          "hw_power_brake", "display_clocks"};
  std::vector<std::string> out;
  for (unsigned bit = 0; bit < 64; ++bit) {
    const uint64_t b = uint64_t{1} << bit;
    if (!(mask & b)) continue;
    if (bit < kNames.size()) {
      out.emplace_back(kNames[bit]);
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "other_0x%llx", static_cast<unsigned long long>(b));
      out.emplace_back(buf);
    }
  }
  return out;
}

namespace {

template <typename F>
void resolve(void* h, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(h, name));
}

}  // namespace

std::shared_ptr<Nvml> Nvml::open(const std::string& lib) {
  std::shared_ptr<Nvml> n(new Nvml());
  std::string path = lib;
  if (path.empty()) {
    const char* env = std::getenv("MOETIER_NVML_LIB");
    path = env && *env ? env : "libnvidia-ml.so.1";
  }
  n->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!n->handle_) {
    const char* e = dlerror();
    n->problem_ = "cannot load " + path + (e ? std::string(": ") + e : std::string());
    return n;
  }
  auto api = std::make_unique<Api>();
  void* h = n->handle_;
  resolve(h, api->init, "nvmlInit_v2");
  resolve(h, api->shutdown, "nvmlShutdown");
  resolve(h, api->count, "nvmlDeviceGetCount_v2");
  resolve(h, api->handle, "nvmlDeviceGetHandleByIndex_v2");
  resolve(h, api->name, "nvmlDeviceGetName");
  resolve(h, api->temperature, "nvmlDeviceGetTemperature");
  resolve(h, api->power, "nvmlDeviceGetPowerUsage");
  resolve(h, api->clock, "nvmlDeviceGetClockInfo");
  resolve(h, api->memory, "nvmlDeviceGetMemoryInfo");
  resolve(h, api->reasons, "nvmlDeviceGetCurrentClocksEventReasons");
  if (!api->reasons) resolve(h, api->reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  resolve(h, api->driver, "nvmlSystemGetDriverVersion");
  if (!api->init || !api->shutdown || !api->count || !api->handle) {
    n->problem_ = path + " lacks nvmlInit_v2, nvmlShutdown or the device functions";
    return n;
  }
  const int rc = api->init();
  if (rc != kSuccess) {
    n->problem_ = "nvmlInit_v2 failed (NVML error " + std::to_string(rc) + ")";
    return n;
  }
  unsigned count = 0;
  if (api->count(&count) != kSuccess) count = 0;
  n->api_ = std::move(api);
  n->ok_ = true;
  n->count_ = count;
  if (count == 0) n->problem_ = "NVML reports no GPU";
  return n;
}

std::shared_ptr<Nvml> Nvml::shared() {
  static std::once_flag once;
  static std::shared_ptr<Nvml> instance;
  std::call_once(once, [] { instance = open(""); });
  return instance;
}

Nvml::~Nvml() {
  if (ok_ && api_) api_->shutdown();
}

GpuReading Nvml::read(unsigned index) const {
  GpuReading r;
  Device d = nullptr;
  if (!ok_ || index >= count_ || api_->handle(index, &d) != kSuccess) return r;
  unsigned v = 0;
  if (api_->temperature && api_->temperature(d, kTemperatureGpu, &v) == kSuccess) r.temp_c = v;
  if (api_->power && api_->power(d, &v) == kSuccess) r.power_w = v / 1000.0;
  if (api_->clock && api_->clock(d, kClockSm, &v) == kSuccess) r.sm_clock_mhz = v;
  Memory m{};
  if (api_->memory && api_->memory(d, &m) == kSuccess) {
    r.mem_used_bytes = m.used;
    r.mem_free_bytes = m.free;
    r.mem_total_bytes = m.total;
  }
  unsigned long long reasons = 0;
  if (api_->reasons && api_->reasons(d, &reasons) == kSuccess) r.throttle_mask = reasons;
  return r;
}

GpuIdentity Nvml::identity(unsigned index) const {
  GpuIdentity id;
  Device d = nullptr;
  if (!ok_ || index >= count_ || api_->handle(index, &d) != kSuccess) return id;
  char buf[256] = {};
  if (api_->name && api_->name(d, buf, sizeof buf - 1) == kSuccess) id.name = buf;
  Memory m{};
  if (api_->memory && api_->memory(d, &m) == kSuccess) id.memory_bytes = m.total;
  return id;
}

std::string Nvml::driver_version() const {
  char buf[128] = {};
  if (!ok_ || !api_->driver || api_->driver(buf, sizeof buf - 1) != kSuccess) return "";
  return buf;
}

}  // namespace moetier::monitor
