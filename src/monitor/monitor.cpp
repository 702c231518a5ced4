#include "monitor/monitor.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace moetier::monitor {
namespace {

using Clock = std::chrono::steady_clock;

template <typename T>
void put(nlohmann::json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

void put_gpu(nlohmann::json& s, const GpuReading& g) {
  put(s, "gpu_temp_c", g.temp_c);
  put(s, "gpu_power_w", g.power_w);
  put(s, "gpu_sm_clock_mhz", g.sm_clock_mhz);
  put(s, "gpu_mem_used_bytes", g.mem_used_bytes);
  put(s, "gpu_mem_free_bytes", g.mem_free_bytes);
  if (g.throttle_mask) s["throttle"] = throttle_names(*g.throttle_mask);
}

}  // namespace

Monitor::Monitor(double period_s) : Monitor(period_s, Nvml::shared()) {}

Monitor::Monitor(double period_s, std::shared_ptr<Nvml> nvml, HostPaths host)
    : period_s_(period_s), nvml_(std::move(nvml)), host_(std::move(host)), start_(Clock::now()) {
  if (period_s_ > 0) thread_ = std::thread([this] { run(); });
}

Monitor::~Monitor() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Monitor::set_phase(std::string phase) {
  std::lock_guard lk(mu_);
  phase_ = std::move(phase);
}

nlohmann::json Monitor::take(const std::string& phase) const {
  const double t = std::chrono::duration<double>(Clock::now() - start_).count();
  nlohmann::json s = nlohmann::json::object();
  s["t_s"] = std::round(t * 1000.0) / 1000.0;
  s["phase"] = phase;
  if (nvml_ && nvml_->available() && nvml_->device_count() > 0) put_gpu(s, nvml_->read(0));
  const HostReading h = read_host(host_);
  put(s, "host_mem_available_bytes", h.mem_available_bytes);
  put(s, "rss_bytes", h.rss_bytes);
  put(s, "read_bytes", h.read_bytes);
  return s;
}

void Monitor::sample_now() {
  std::string phase;
  {
    std::lock_guard lk(mu_);
    phase = phase_;
  }
  nlohmann::json s = take(phase);
  std::lock_guard lk(mu_);
  samples_.push_back(std::move(s));
}

void Monitor::run() {
  const auto period =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(period_s_));
  auto next = start_;
  std::unique_lock lk(mu_);
  while (!stop_) {
    lk.unlock();
    sample_now();
    lk.lock();
    // Ticks already past (a stall) are skipped: their samples stay missing.
    const auto now = Clock::now();
    do next += period;
    while (next <= now);
    cv_.wait_until(lk, next, [this] { return stop_; });
  }
}

nlohmann::json Monitor::to_json() const {
  std::vector<nlohmann::json> copy;
  {
    std::lock_guard lk(mu_);
    copy = samples_;
  }
  std::stable_sort(copy.begin(), copy.end(), [](const auto& a, const auto& b) {
    return a["t_s"].template get<double>() < b["t_s"].template get<double>();
  });
  nlohmann::json out = nlohmann::json::array();
  for (auto& s : copy) out.push_back(std::move(s));
  return out;
}

size_t Monitor::size() const {
  std::lock_guard lk(mu_);
  return samples_.size();
}

nlohmann::json gpu_identity(const Nvml& nvml) {
  nlohmann::json j = nlohmann::json::object();
  if (!nvml.available() || nvml.device_count() == 0) return j;
  const GpuIdentity id = nvml.identity(0);
  if (!id.name.empty()) j["gpu"] = id.name;
  if (id.memory_bytes) j["gpu_memory_bytes"] = *id.memory_bytes;
  const std::string driver = nvml.driver_version();
  if (!driver.empty()) j["driver"] = driver;
  j["gpu_count"] = nvml.device_count();
  return j;
}

nlohmann::json gpu_identity() { return gpu_identity(*Nvml::shared()); }

}  // namespace moetier::monitor
