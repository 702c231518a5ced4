#include "runtime/moe_block.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace moetier {
namespace {

void check_expert(const ExpertView& v, int64_t layer, int32_t id, int64_t h, int64_t in) {
  check(v.gate.rows == in && v.gate.cols == h && v.up.rows == in && v.up.cols == h &&
            v.down.rows == h && v.down.cols == in,
        "layer {} expert {}: provider returned shapes gate [{}, {}] up [{}, {}] down [{}, {}], "
        "expected [{}, {}], [{}, {}], [{}, {}]",
        layer, id, v.gate.rows, v.gate.cols, v.up.rows, v.up.cols, v.down.rows, v.down.cols, in, h,
        in, h, h, in);
}

// The pairs [offsets[b0], offsets[b0 + cnt]) of experts b0 .. b0 + cnt - 1 on the backend.
void run_batch(Backend& be, const MoeBlock& b, const ExpertGroups& g,
               std::span<const float> weights, size_t b0, std::span<const int32_t> ids,
               const std::vector<ExpertView>& views) {
  const size_t cnt = ids.size();
  check(views.size() == cnt, "layer {}: expert provider returned {} views for {} experts", b.layer,
        views.size(), cnt);
  for (size_t i = 0; i < cnt; ++i)
    check_expert(views[i], b.layer, ids[i], b.hidden, b.intermediate);
  const int64_t p0 = g.offsets[b0];
  std::vector<int64_t> offsets(g.offsets.begin() + int64_t(b0),
                               g.offsets.begin() + int64_t(b0 + cnt + 1));  // [cnt + 1]
  for (int64_t& o : offsets) o -= p0;
  ExpertBatch eb;
  eb.experts = views;
  eb.offsets = offsets;
  eb.tokens = std::span<const int64_t>(g.tokens).subspan(size_t(p0), size_t(offsets.back()));
  eb.weights = weights.subspan(size_t(p0), size_t(offsets.back()));
  eb.x = b.x;
  eb.n = b.routing->n_tokens;
  eb.hidden = b.hidden;
  eb.intermediate = b.intermediate;
  eb.out = b.out;
  be.expert_batch(eb);
}

}  // namespace

// Batch i is computed while batch i + 1 is read, when the provider says the
// next submit decides as it would with batch i released (can_overlap);
// otherwise batch i is released first, as a synchronous acquire would.
void run_moe_block(Backend& be, ExpertProvider& experts, const MoeBlock& b) {
  const Routing& r = *b.routing;
  const ExpertGroups g = group_by_expert(r);
  be.fill_zero(b.out, r.n_tokens * b.hidden);
  const int64_t batch = experts.max_batch();
  check(batch >= 1, "layer {}: expert provider max_batch() is {}", b.layer, batch);
  std::vector<float> weights(g.tokens.size());  // [pairs] routing weight of each pair
  for (size_t p = 0; p < g.tokens.size(); ++p)
    weights[p] = r.weights[size_t(g.tokens[p] * r.k + g.slots[p])];
  auto ids_of = [&](size_t b0) {
    return std::span<const int32_t>(g.ids.data() + b0, std::min(g.ids.size() - b0, size_t(batch)));
  };
  std::vector<ExpertView> views;
  TicketGuard cur, next;  // batch i (being computed) and batch i + 1 (being read)
  if (!g.ids.empty()) cur.reset(&experts, experts.submit(b.layer, ids_of(0), b.phase));
  if (b.after_first_submit) b.after_first_submit();
  for (size_t b0 = 0; b0 < g.ids.size(); b0 += size_t(batch)) {
    const std::span<const int32_t> ids = ids_of(b0);
    const size_t n0 = b0 + ids.size();  // first expert of the next batch
    try {
      experts.wait(cur.get(), views);
    } catch (...) {
      cur.take();  // a failed wait finished the ticket
      throw;
    }
    if (n0 < g.ids.size()) {
      const Ticket t = experts.submit_overlapped(b.layer, ids_of(n0), b.phase);
      if (t.valid()) next.reset(&experts, t);
    }
    run_batch(be, b, g, weights, b0, ids, views);
    cur.reset();  // batch i's experts may go
    if (n0 < g.ids.size() && !next.get().valid())
      next.reset(&experts, experts.submit(b.layer, ids_of(n0), b.phase));
    cur.reset(&experts, next.take());
  }
  experts.note_routing(b.layer, r.experts, r.k);  // accounting (all-k-hit share)
}

}  // namespace moetier
