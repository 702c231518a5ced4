// The device monitor (DESIGN.md "How speed is shown", issue 11 item 3): a
// sampler thread that records, every period (default 5 s), the GPU's
// temperature, power, SM clock, memory used and free and throttle reasons
// (NVML, loaded at run time, when a GPU exists) and always the host's
// MemAvailable, the process's RSS and its storage read bytes, each sample
// tagged with the phase the caller set. A reading whose source failed is
// omitted from that sample (a gap in the chart); a tick the thread missed
// (the machine stalled past it) is skipped, never filled in.
//
// Concurrency protocol:
// - The constructor takes a first sample at t = 0 on the sampler thread and
//   one every period after that, on a fixed grid (start + n * period); a
//   period <= 0 starts no thread (samples come only from sample_now()).
// - set_phase, sample_now, to_json and size may be called from any thread at
//   any time. One mutex guards the phase and the sample list; a sample reads
//   the phase under it, takes its readings outside it (NVML and /proc reads
//   can take milliseconds and never block set_phase), then appends under it.
// - A sample carries the phase current when it started. set_phase does not
//   sample; call sample_now() after it for a reading at the boundary.
// - The destructor stops the thread and joins it (waking it at once); no
//   sample is taken after it returns. Readings through NVML are thread-safe
//   (nvml.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "monitor/host.h"
#include "monitor/nvml.h"

namespace moetier::monitor {

class Monitor {
 public:
  // NVML through Nvml::shared() (GPU 0), the host through /proc.
  explicit Monitor(double period_s = 5.0);
  // NVML through NVML (nullptr: no GPU source), host readings from HOST.
  Monitor(double period_s, std::shared_ptr<Nvml> nvml, HostPaths host = {});
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  void set_phase(std::string phase);
  void sample_now();
  // The "monitor" array of docs/bench-format.md, in time order.
  nlohmann::json to_json() const;
  size_t size() const;

 private:
  void run();
  nlohmann::json take(const std::string& phase) const;

  const double period_s_;
  const std::shared_ptr<Nvml> nvml_;
  const HostPaths host_;
  const std::chrono::steady_clock::time_point start_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string phase_ = "setup";
  std::vector<nlohmann::json> samples_;
  std::thread thread_;
};

// The "machine" section's GPU fields through NVML (GPU 0): "gpu" (name),
// "gpu_memory_bytes", "driver", "gpu_count"; each omitted when its call
// failed; an empty object without NVML or a GPU.
nlohmann::json gpu_identity();
nlohmann::json gpu_identity(const Nvml& nvml);

}  // namespace moetier::monitor
