// What a data-parallel rank holds and saves: ZeRO 3's whole model on demand, the resident
// state, the optimizer state gathered or by owned range, and its masters' views.
#include "parallel/data_parallel_impl.h"

namespace loom::parallel {

void DataParallel::materialize_params() { impl_->zero->materialize(*impl_); }

StateBytes DataParallel::state_bytes() const {
  const Impl& m = *impl_;
  StateBytes b;
  // Measured (resident pages), not assumed: what the rank really holds right now.
  b.params = resident_bytes(m.params.values().raw(), m.params.values().nbytes());
  b.grads = resident_bytes(m.params.grads().raw(), m.params.grads().nbytes());
  const auto [shard_params, shard_grads] = m.zero->own_bytes();
  b.params += shard_params;
  b.grads += shard_grads;
  for (const auto& [name, t] : m.optimizer->state()) b.optimizer += resident_bytes(t.raw(), t.nbytes());
  return b;
}

int64_t DataParallel::optimizer_steps() const { return impl_->optimizer->steps(); }

optim::FlatState DataParallel::gather_optimizer_state() {
  Impl& m = *impl_;
  optim::FlatState s;
  s.steps = m.optimizer->steps();
  auto own = m.optimizer->state();
  for (size_t k = 0; k < own.size(); ++k) {
    s.buffers.emplace_back(own[k].first, Tensor::zeros({m.params.numel()}, own[k].second.dtype()));
    if (!m.zero->shards_state()) {
      s.buffers[k].second.copy_from(own[k].second);
      continue;
    }
    for (Unit& u : m.units) m.uc.gather(u, s.buffers[k].second, own[k].second, u.shard_offset, "all-gather optimizer state");
  }
  return s;
}

std::vector<std::pair<int64_t, int64_t>> DataParallel::owned_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Unit& u : impl_->units)
    if (u.mine_end(impl_->me) > u.mine_begin(impl_->me)) out.emplace_back(u.mine_begin(impl_->me), u.mine_end(impl_->me));
  return out;
}

std::vector<Tensor> DataParallel::owned_values() const {
  const Impl& m = *impl_;
  std::vector<Tensor> views;
  for (const Unit& u : m.units) {
    const int64_t len = u.mine_end(m.me) - u.mine_begin(m.me);
    if (len <= 0) continue;
    views.push_back(m.zero->part_values(m, u, len));
  }
  return views;
}

void DataParallel::release_gathered() { impl_->zero->release_gathered(*impl_); }

optim::RangeState DataParallel::owned_optimizer_state() const {
  const Impl& m = *impl_;
  optim::RangeState s{.ranges = owned_ranges(), .steps = m.optimizer->steps()};
  for (const auto& [name, own] : m.optimizer->state()) {
    std::vector<Tensor> views;
    for (const Unit& u : m.units) {
      const int64_t len = u.mine_end(m.me) - u.mine_begin(m.me);
      if (len <= 0) continue;
      const int64_t at = m.zero->shards_state() ? u.shard_offset : u.mine_begin(m.me);  // where the part is in `own`
      views.push_back(own.slice_rows(at, at + len));
    }
    s.buffers.emplace_back(name, std::move(views));
  }
  return s;
}

optim::RangeState DataParallel::kept_optimizer_state() const {
  const Impl& m = *impl_;
  if (m.zero->shards_state()) return owned_optimizer_state();
  optim::RangeState s{.ranges = {{0, m.params.numel()}}, .steps = m.optimizer->steps()};
  for (const auto& [name, own] : m.optimizer->state()) s.buffers.push_back({name, {own}});
  return s;
}

void DataParallel::set_optimizer_steps(int64_t steps) { impl_->optimizer->set_steps(steps); }

}  // namespace loom::parallel
