#include "experts/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/units.h"
#include "format/safetensors.h"
#include "io/sysinfo.h"
#include "model/spec.h"

namespace moetier {

namespace {

// Slots for "--arena N%" of `total` experts; 0 when `text` is not a percentage.
size_t percent_slots(const std::string& text, size_t total) {
  const auto pct = parse_percent(text, "--arena");
  return pct ? size_t(percent_of(*pct, total)) : 0;
}

struct Sizing {
  size_t hot = 0, transient = 0;
  std::string how;
};

Sizing size_hot(const ExpertIndex& ix, const ModelSpec& cfg, const ExpertOptions& opt) {
  const size_t total = ix.total_experts(), slot = ix.slot_bytes();
  const int64_t E = cfg.num_experts, k = cfg.experts_per_token;
  check(opt.arena.empty() || opt.arena_experts < 0,
        "--arena and --arena-experts are alternatives; give one");
  check(opt.transient >= -1, "--transient: {} must not be negative", opt.transient);
  Sizing s;
  if (opt.arena_experts >= 0) {
    check(opt.arena_experts > 0, "--arena-experts: needs at least 1 slot");
    s.hot = size_t(opt.arena_experts);
    s.how = "--arena-experts";
  } else if (!opt.arena.empty()) {
    s.hot = percent_slots(opt.arena, total);
    if (s.hot == 0) {
      uint64_t bytes = parse_bytes(opt.arena, "--arena");
      s.hot = size_t(bytes / slot);
      check(s.hot > 0, "--arena: {} holds no expert (one slot is {})", opt.arena,
            format_bytes(slot));
    }
    s.how = "--arena " + opt.arena;
  } else {
    auto avail = io::mem_available_bytes();
    check(avail.has_value(),
          "cannot read MemAvailable from /proc/meminfo; give --arena or --arena-experts");
    size_t budget = size_t(*avail / 2 / slot);
    size_t ring =
        opt.transient >= 0 ? size_t(opt.transient) : default_transient_slots(budget, E, k);
    check(budget > ring + size_t(k),
          "half of MemAvailable ({}) holds only {} experts of {}; give --arena or "
          "--arena-experts",
          format_bytes(*avail / 2), budget, format_bytes(slot));
    s.hot = budget - ring;
    s.transient = ring;
    s.how = fmt::format("default: half of MemAvailable {}", format_bytes(*avail));
  }
  if (s.hot > total) {
    s.how += fmt::format(", capped at the model's {} experts", total);
    s.hot = total;
  }
  if (opt.transient >= 0) {
    s.transient = size_t(opt.transient);
  } else if (s.transient == 0) {
    s.transient = default_transient_slots(s.hot, E, k);
  }
  return s;
}

}  // namespace

size_t default_transient_slots(size_t hot, int64_t num_experts, int64_t k) {
  return std::min<size_t>(size_t(num_experts), std::max<size_t>(size_t(k), hot / 8));
}

size_t pinned_limit(size_t hot, int64_t k) {
  size_t reserve = std::max<size_t>(size_t(k), (hot + 3) / 4);
  return hot > reserve ? hot - reserve : 0;
}

ArenaConfig resolve_arena_config(const ExpertIndex& ix, const ModelSpec& cfg,
                                 const ExpertOptions& opt, std::string* summary) {
  const size_t total = ix.total_experts(), slot = ix.slot_bytes();
  Sizing s = size_hot(ix, cfg, opt);
  ArenaConfig ac;
  ac.hot_slots = s.hot;
  ac.transient_slots = s.transient;
  if (!opt.host_cache.empty()) {
    ac.host_slots = std::min<size_t>(total, parse_bytes(opt.host_cache, "--host-cache") / slot);
  }
  ac.policy = parse_policy_kind(opt.policy);
  check(opt.ranking.empty() || ac.policy == PolicyKind::Pinned,
        "--ranking: only used with --policy pinned");
  if (ac.policy == PolicyKind::Pinned) {
    check(!opt.ranking.empty(), "--policy pinned: needs --ranking FILE (from moetier trace)");
    ac.ranking = read_ranking(opt.ranking, cfg.num_layers, cfg.num_experts);
    ac.max_pinned = pinned_limit(s.hot, cfg.experts_per_token);
  }
  check(opt.io == "auto" || opt.io == "uring" || opt.io == "pool",
        "--io: unknown reader '{}' (auto, uring, pool)", opt.io);
  ac.reader = opt.io == "uring"  ? io::ReaderKind::Uring
              : opt.io == "pool" ? io::ReaderKind::Pool
                                 : io::ReaderKind::Auto;
  check(opt.io_depth >= 1 && opt.io_depth <= 4096, "--io-depth: {} outside [1, 4096]",
        opt.io_depth);
  ac.io_depth = opt.io_depth;
  ac.direct = !opt.buffered;
  ac.note = opt.note;
  if (summary) {
    *summary = fmt::format(
        "experts: arena {} hot + {} transient slots x {} = {} ({:.1f}% of {} experts; {}), "
        "host tier {} slots, policy {}",
        ac.hot_slots, ac.transient_slots, format_bytes(slot),
        format_bytes(uint64_t(ac.hot_slots + ac.transient_slots) * slot),
        100.0 * double(ac.hot_slots) / double(total), total, s.how, ac.host_slots, opt.policy);
  }
  return ac;
}

std::unique_ptr<ArenaExperts> make_expert_provider(const Checkpoint& ck, const ModelSpec& cfg,
                                                   const ExpertOptions& opt, ExpertStats* stats,
                                                   std::string* summary, Backend* backend) {
  ExpertIndex ix = ExpertIndex::build(ck, cfg);
  std::string line;
  ArenaConfig ac = resolve_arena_config(ix, cfg, opt, &line);
  ac.backend = backend;
  ac.top_k = cfg.experts_per_token;
  check(opt.prefetch == "none" || opt.prefetch == "next-layer",
        "--prefetch {}: expected none or next-layer", opt.prefetch);
  ac.next_layer_hints = opt.prefetch == "next-layer";
  auto p = std::make_unique<ArenaExperts>(std::move(ix), ac, stats);
  if (summary) {
    const ArenaExperts::Setup& su = p->setup();
    *summary = line + ", reader " + p->reader_name() +
               fmt::format(", set-up {:.3f} s ({} pre-faulted{})", double(su.ns) * 1e-9,
                           format_bytes(su.prefault.bytes), su.prefault.huge ? ", huge pages" : "");
    if (p->mapped_host()) *summary += ", mapped host tier";
  }
  return p;
}

}  // namespace moetier
