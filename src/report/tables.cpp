// The exact-value tables beside each chart (also what the page shows where
// scripts do not run).
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "report/html.h"

namespace moetier::report::detail {
namespace {

using nlohmann::json;

std::string str(const json& obj, const char* key) {
  return obj.contains(key) && obj[key].is_string() ? obj[key].get<std::string>() : "";
}

// A cell of a number (exact, as format_number writes it) with a unit suffix;
// "—" when not measured.
std::string num_cell(std::optional<double> v, const char* unit = "") {
  if (!v) return "<td class=na>—</td>";
  return fmt::format("<td class=num>{}{}</td>", format_number(*v), unit);
}

std::string bytes_cell(std::optional<double> v) {
  if (!v) return "<td class=na>—</td>";
  return fmt::format("<td class=num title=\"{} B\">{}</td>", format_number(*v), human_bytes(*v));
}

std::string text_cell(const std::string& s) { return "<td>" + escape(s) + "</td>"; }

std::string head_row(std::initializer_list<const char*> cols) {
  std::string s = "<thead><tr>";
  for (const char* c : cols) s += fmt::format("<th>{}</th>", c);
  return s + "</tr></thead>";
}

// "512.3 (505–515)" of a workload figure: median with min–max of the runs,
// then the bound and the fraction of it.
std::string figure_cells(const json& w, const char* key, const char* unit) {
  const auto med = number_at(w, fmt::format("median.{}", key));
  const auto lo = number_at(w, fmt::format("min.{}", key));
  const auto hi = number_at(w, fmt::format("max.{}", key));
  std::string s;
  if (!med) {
    s += "<td class=na>—</td>";
  } else {
    s += fmt::format("<td class=num>{}{}", format_number(*med), unit);
    if (lo && hi)
      s += fmt::format(" <small>({}–{})</small>", format_number(*lo), format_number(*hi));
    s += "</td>";
  }
  s += num_cell(number_at(w, fmt::format("bound.{}", key)), unit);
  const auto frac = number_at(w, fmt::format("fraction_of_bound.{}", key));
  s += frac ? fmt::format("<td class=num>{}%</td>", format_number(*frac * 100.0))
            : "<td class=na>—</td>";
  return s;
}

const json& workloads(const ArmRef& a) {
  static const json kEmpty = json::array();
  return a.arm->contains("workloads") ? (*a.arm)["workloads"] : kEmpty;
}

}  // namespace

std::string files_table(const std::vector<ResultFile>& files) {
  std::string s = "<table>" +
                  head_row({"file", "command", "commit", "started", "cpu", "cores", "RAM", "GPU",
                            "GPU memory", "driver", "bounds"}) +
                  "<tbody>";
  for (const auto& f : files) {
    const json& d = f.doc;
    const json m = d.value("machine", json::object());
    std::string bounds;
    const json measured = d.value("bounds", json::object());  // items() needs a live object
    for (const auto& [k, v] : measured.items())
      bounds +=
          fmt::format("{}{} = {}", bounds.empty() ? "" : "; ", k, format_number(v.get<double>()));
    s += "<tr>" + text_cell(f.path) + "<td><code>" + escape(str(d, "command")) + "</code></td>" +
         text_cell(str(d, "commit")) + text_cell(str(d, "started")) + text_cell(str(m, "cpu")) +
         num_cell(number_at(m, "cores")) + bytes_cell(number_at(m, "ram_bytes")) +
         text_cell(str(m, "gpu")) + bytes_cell(number_at(m, "gpu_memory_bytes")) +
         text_cell(str(m, "driver")) + text_cell(bounds) + "</tr>";
  }
  return s + "</tbody></table>";
}

std::string arms_table(const std::vector<ArmRef>& arms) {
  std::string s = "<table>" +
                  head_row({"arm", "engine", "version", "flags", "model", "architecture",
                            "model bytes", "active bytes / token", "load"}) +
                  "<tbody>";
  for (const auto& a : arms) {
    const json& r = *a.arm;
    const json m = r.value("model", json::object());
    s += "<tr>" + text_cell(str(r, "name")) + text_cell(str(r, "engine")) +
         text_cell(str(r, "version")) + "<td><code>" + escape(str(r, "flags")) + "</code></td>" +
         text_cell(str(m, "dir")) + text_cell(str(m, "architecture")) +
         bytes_cell(number_at(m, "total_bytes")) +
         bytes_cell(number_at(m, "active_bytes_per_token")) +
         num_cell(number_at(r, "load_s"), " s") + "</tr>";
  }
  return s + "</tbody></table>";
}

std::string throughput_table(const std::vector<ArmRef>& arms) {
  std::string s = "<table>" +
                  head_row({"workload", "arm", "prompt tokens", "generated", "runs",
                            "decode tok/s (min–max)", "bound", "of bound", "prompt tok/s (min–max)",
                            "bound", "of bound", "TTFT s (min–max)", "coherence failures"}) +
                  "<tbody>";
  for (const auto& a : arms) {
    for (const auto& w : workloads(a)) {
      const size_t runs = w.contains("runs") ? w["runs"].size() : 0;
      const auto prompts = number_at(w, "coherence.prompts");
      const auto fails = number_at(w, "coherence.failures");
      s += "<tr>" + text_cell(str(w, "name")) + text_cell(str(*a.arm, "name")) +
           num_cell(number_at(w, "prompt_tokens")) + num_cell(number_at(w, "gen_tokens")) +
           fmt::format("<td class=num>{}</td>", runs) + figure_cells(w, "decode_tps", "") +
           figure_cells(w, "prompt_tps", "");
      const auto ttft = number_at(w, "median.ttft_s");
      const auto lo = number_at(w, "min.ttft_s"), hi = number_at(w, "max.ttft_s");
      if (ttft && lo && hi) {
        s += fmt::format("<td class=num>{} <small>({}–{})</small></td>", format_number(*ttft),
                         format_number(*lo), format_number(*hi));
      } else {
        s += num_cell(ttft);
      }
      s += prompts && fails ? fmt::format("<td class=num>{} of {}</td>", format_number(*fails),
                                          format_number(*prompts))
                            : "<td class=na>—</td>";
      s += "</tr>";
    }
  }
  return s + "</tbody></table>";
}

namespace {

// The most peak_device_bytes of an arm's runs; nullopt when none has it.
std::optional<double> max_device_peak(const ArmRef& a) {
  std::optional<double> best;
  for (const auto& w : workloads(a)) {
    if (!w.contains("runs") || !w["runs"].is_array()) continue;
    for (const auto& r : w["runs"])
      if (const auto v = number_at(r, "peak_device_bytes")) best = std::max(best.value_or(*v), *v);
  }
  return best;
}

}  // namespace

std::string memory_table(const std::vector<ArmRef>& arms) {
  std::string s = "<table>" +
                  head_row({"arm", "budget", "core", "arena", "KV cache", "headroom", "host tier",
                            "peak device (most of the runs)"}) +
                  "<tbody>";
  for (const auto& a : arms) {
    const json m = a.arm->value("memory", json::object());
    s += "<tr>" + text_cell(str(*a.arm, "name"));
    for (const char* k : {"budget_bytes", "core_bytes", "arena_bytes", "kv_bytes", "headroom_bytes",
                          "host_tier_bytes"})
      s += bytes_cell(number_at(m, k));
    s += bytes_cell(max_device_peak(a)) + "</tr>";
  }
  return s + "</tbody></table>";
}

std::string storage_table(const std::vector<ArmRef>& arms) {
  std::string s = "<table>" +
                  head_row({"workload", "arm", "run", "cold", "page cache dropped", "TTFT s",
                            "prompt tok/s", "decode tok/s", "expert uses", "expert reads",
                            "expert read bytes", "physical read bytes", "I/O stall s",
                            "hit rate (all)", "hit rates by tier", "peak host", "peak device"}) +
                  "<tbody>";
  for (const auto& a : arms) {
    for (const auto& w : workloads(a)) {
      if (!w.contains("runs")) continue;
      for (size_t i = 0; i < w["runs"].size(); ++i) {
        const json& r = w["runs"][i];
        std::string tiers;
        const json rates = r.value("hit_rate", json::object());
        for (const auto& [k, v] : rates.items())
          if (k != "all")
            tiers += fmt::format("{}{} {}", tiers.empty() ? "" : ", ", k,
                                 format_number(v.get<double>()));
        auto flag = [&](const char* k) {
          return r.contains(k) ? text_cell(r[k].get<bool>() ? "yes" : "no") : "<td class=na>—</td>";
        };
        s += "<tr>" + text_cell(str(w, "name")) + text_cell(str(*a.arm, "name")) +
             fmt::format("<td class=num>{}</td>", i + 1) + flag("cold") +
             flag("page_cache_dropped") + num_cell(number_at(r, "ttft_s")) +
             num_cell(number_at(r, "prompt_tps")) + num_cell(number_at(r, "decode_tps")) +
             num_cell(number_at(r, "expert_uses")) + num_cell(number_at(r, "expert_reads")) +
             bytes_cell(number_at(r, "expert_read_bytes")) +
             bytes_cell(number_at(r, "physical_read_bytes")) +
             num_cell(number_at(r, "io_stall_s")) + num_cell(number_at(r, "hit_rate.all")) +
             text_cell(tiers) + bytes_cell(number_at(r, "peak_host_bytes")) +
             bytes_cell(number_at(r, "peak_device_bytes")) + "</tr>";
      }
    }
  }
  return s + "</tbody></table>";
}

std::string simulate_table(const std::vector<ResultFile>& files) {
  std::string s =
      "<table>" +
      head_row({"file", "policy", "budget (experts)", "budget bytes", "hit rate", "all-k share"}) +
      "<tbody>";
  for (const auto& f : files) {
    for (const auto& c : f.doc.value("simulate", json::array())) {
      for (size_t i = 0; i < c["budget_experts"].size(); ++i) {
        auto at = [&](const char* k) -> std::optional<double> {
          if (!c.contains(k)) return std::nullopt;
          return c[k][i].get<double>();
        };
        s += "<tr>" + text_cell(f.path) + text_cell(str(c, "policy")) +
             num_cell(at("budget_experts")) + bytes_cell(at("budget_bytes")) +
             num_cell(at("hit_rate")) + num_cell(at("all_k_share")) + "</tr>";
      }
    }
  }
  return s + "</tbody></table>";
}

std::string monitor_table(const std::vector<ResultFile>& files) {
  std::string s = "<table>" +
                  head_row({"file", "phase", "samples", "from s", "to s", "max GPU °C", "max GPU W",
                            "min MemAvailable", "max RSS", "throttle reasons (samples)"}) +
                  "<tbody>";
  for (const auto& f : files) {
    struct Phase {
      size_t n = 0, throttle_known = 0;
      std::optional<double> t0, t1, temp, power, avail, rss;
      std::map<std::string, size_t> throttle;
    };
    std::vector<std::string> order;
    std::map<std::string, Phase> phases;
    auto upd = [](std::optional<double>& acc, std::optional<double> v, bool max) {
      if (v) acc = !acc ? *v : (max ? std::max(*acc, *v) : std::min(*acc, *v));
    };
    for (const auto& m : f.doc.value("monitor", json::array())) {
      const std::string ph = m["phase"].get<std::string>();
      if (!phases.count(ph)) order.push_back(ph);
      Phase& p = phases[ph];
      ++p.n;
      upd(p.t0, number_at(m, "t_s"), false);
      upd(p.t1, number_at(m, "t_s"), true);
      upd(p.temp, number_at(m, "gpu_temp_c"), true);
      upd(p.power, number_at(m, "gpu_power_w"), true);
      upd(p.avail, number_at(m, "host_mem_available_bytes"), false);
      upd(p.rss, number_at(m, "rss_bytes"), true);
      if (m.contains("throttle")) ++p.throttle_known;
      for (const auto& r : m.value("throttle", json::array())) ++p.throttle[r.get<std::string>()];
    }
    for (const auto& ph : order) {
      const Phase& p = phases[ph];
      std::string thr;
      for (const auto& [k, n] : p.throttle)
        thr += fmt::format("{}{} ({})", thr.empty() ? "" : ", ", k, n);
      s += "<tr>" + text_cell(f.path) + text_cell(ph) + fmt::format("<td class=num>{}</td>", p.n) +
           num_cell(p.t0) + num_cell(p.t1) + num_cell(p.temp) + num_cell(p.power) +
           bytes_cell(p.avail) + bytes_cell(p.rss) +
           text_cell(!p.throttle_known ? "not measured"
                     : thr.empty()     ? "none"
                                       : thr) +
           "</tr>";
    }
  }
  return s + "</tbody></table>";
}

}  // namespace moetier::report::detail
