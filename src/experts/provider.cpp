#include "experts/provider.h"

namespace moetier {

void ExpertProvider::acquire(int64_t layer, std::span<const int32_t> ids, Phase phase,
                             std::vector<ExpertView>& views) {
  views.clear();
  release_acquired();
  const Ticket t = submit(layer, ids, phase);
  wait(t, views);  // on a throw the ticket is already finished
  acquired_ = t;
}

void ExpertProvider::release_acquired() {
  if (!acquired_.valid()) return;
  const Ticket t = acquired_;
  acquired_ = {};
  release(t);
}

void TicketGuard::reset(ExpertProvider* p, Ticket t) {
  if (p_ && t_.valid()) {
    try {
      p_->release(t_);
    } catch (...) {  // release of a live ticket does not fail; never throw from a destructor
    }
  }
  p_ = p;
  t_ = t;
}

Ticket TicketGuard::take() {
  const Ticket t = t_;
  t_ = {};
  p_ = nullptr;
  return t;
}

}  // namespace moetier
