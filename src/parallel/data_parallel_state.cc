// What a data-parallel rank holds and saves: ZeRO 3's whole model on demand, the resident
// state, the optimizer state gathered or by owned range, and its masters' views.
#include "parallel/data_parallel_impl.h"

namespace loom::parallel {

void DataParallel::materialize_params() {
  Impl& m = *impl_;
  if (!m.zero3()) return;
  for (size_t g = 0; g < m.groups.size(); ++g) m.launch_gather(static_cast<int>(g));  // all in flight at once
  for (size_t g = 0; g < m.groups.size(); ++g) m.need(static_cast<int>(g));
  m.pinned = true;
}

StateBytes DataParallel::state_bytes() const {
  const Impl& m = *impl_;
  StateBytes b;
  // Measured (resident pages), not assumed: what the rank really holds right now.
  b.params = resident_bytes(m.params.values().raw(), m.params.values().nbytes());
  if (m.shard_values.defined()) b.params += resident_bytes(m.shard_values.raw(), m.shard_values.nbytes());
  b.grads = resident_bytes(m.params.grads().raw(), m.params.grads().nbytes());
  if (m.shard_grads.defined()) b.grads += resident_bytes(m.shard_grads.raw(), m.shard_grads.nbytes());
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
    if (!m.sharded()) {
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
    views.push_back(m.zero3() ? m.shard_values.slice_rows(u.shard_offset, u.shard_offset + len)
                              : m.params.values().slice_rows(u.mine_begin(m.me), u.mine_end(m.me)));
  }
  return views;
}

void DataParallel::release_gathered() {
  Impl& m = *impl_;
  if (m.zero3() && !m.pinned) m.release_all();
}

optim::RangeState DataParallel::owned_optimizer_state() const {
  const Impl& m = *impl_;
  optim::RangeState s{.ranges = owned_ranges(), .steps = m.optimizer->steps()};
  for (const auto& [name, own] : m.optimizer->state()) {
    std::vector<Tensor> views;
    for (const Unit& u : m.units) {
      const int64_t len = u.mine_end(m.me) - u.mine_begin(m.me);
      if (len <= 0) continue;
      const int64_t at = m.sharded() ? u.shard_offset : u.mine_begin(m.me);  // where the part is in `own`
      views.push_back(own.slice_rows(at, at + len));
    }
    s.buffers.emplace_back(name, std::move(views));
  }
  return s;
}

optim::RangeState DataParallel::kept_optimizer_state() const {
  const Impl& m = *impl_;
  if (m.sharded()) return owned_optimizer_state();
  optim::RangeState s{.ranges = {{0, m.params.numel()}}, .steps = m.optimizer->steps()};
  for (const auto& [name, own] : m.optimizer->state()) s.buffers.push_back({name, {own}});
  return s;
}

void DataParallel::set_optimizer_steps(int64_t steps) { impl_->optimizer->set_steps(steps); }

}  // namespace loom::parallel
