// ArenaExperts::Job (private to arena_experts.cpp and arena_loads.cpp): the
// storage reads of one submit or prefetch, with where each expert lands.
#pragma once

#include <cstdint>
#include <vector>

#include "experts/arena_experts.h"
#include "experts/loader.h"

namespace moetier {

struct ArenaExperts::Job : LoadJob {
  static constexpr uint32_t kPrefetch = UINT32_MAX;
  uint32_t request = kPrefetch;  // the request it reads for, or kPrefetch
  int64_t layer = 0;
  Plan plan;                     // a prefetch's plan (a request's plan is in the Request)
  std::vector<int32_t> slots;    // [loads] arena slot
  std::vector<int32_t> staging;  // [loads] staging slot (device path) or -1
  std::vector<int32_t> arena_touch, host_touch;  // slots its copies and reads touch (host path)
  bool reaped = false;                           // committed or aborted by the owner
};

}  // namespace moetier
