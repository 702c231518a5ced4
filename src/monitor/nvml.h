// NVML loaded at run time: dlopen("libnvidia-ml.so.1") and dlsym of the few
// functions the monitor needs, declared here (no NVML headers at build time;
// DESIGN.md: the CPU machines' CUDA has no NVML headers).
//
// Nvml::open(lib) loads LIB (default: $MOETIER_NVML_LIB, else
// libnvidia-ml.so.1), resolves the functions and calls nvmlInit_v2. On any
// failure it returns an object with available() false and problem() saying
// why; nothing throws. A function that one driver lacks (the clock-event
// reasons are spelled two ways) leaves that reading absent.
//
// Thread safety: NVML's own calls are thread-safe; an Nvml is immutable after
// open(), so any thread may read through it. nvmlShutdown is called when the
// last reference goes; the library itself stays loaded (dlclose of a driver
// library is not worth its risks).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moetier::monitor {

// One reading of one GPU; a field is empty when its NVML call failed.
struct GpuReading {
  std::optional<double> temp_c, power_w, sm_clock_mhz;
  std::optional<uint64_t> mem_used_bytes, mem_free_bytes, mem_total_bytes;
  std::optional<uint64_t> throttle_mask;  // nvmlClocksEventReasons bits
};

struct GpuIdentity {
  std::string name;  // empty when the call failed
  std::optional<uint64_t> memory_bytes;
};

// The throttle (clock event) reasons of MASK by name, in bit order:
// gpu_idle, applications_clocks, sw_power_cap, hw_slowdown, sync_boost,
// sw_thermal, hw_thermal, hw_power_brake, display_clocks; an unknown bit is
// "other_0xN". The software power cap is its own name, apart from both
// thermal slowdowns and the hardware slowdowns.
std::vector<std::string> throttle_names(uint64_t mask);

class Nvml {
 public:
  // Loads LIB ("" = $MOETIER_NVML_LIB or libnvidia-ml.so.1). Never throws.
  static std::shared_ptr<Nvml> open(const std::string& lib = "");
  // One process-wide instance of open("") (loaded on first use).
  static std::shared_ptr<Nvml> shared();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return ok_; }
  const std::string& problem() const { return problem_; }  // why not available
  unsigned device_count() const { return count_; }
  GpuReading read(unsigned index) const;  // all fields empty when unavailable
  GpuIdentity identity(unsigned index) const;
  std::string driver_version() const;  // empty when the call failed

  struct Api;  // the resolved function pointers (nvml.cpp)

 private:
  Nvml() = default;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  bool ok_ = false;
  unsigned count_ = 0;
  std::string problem_;
};

}  // namespace moetier::monitor
