// What a data-parallel rank holds and saves: ZeRO 3's whole model on demand, the resident
// state, its owned ranges and where their optimizer state sits, and its masters' views.
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
  return b;
}

bool DataParallel::shards_state() const { return impl_->zero->shards_state(); }

void DataParallel::gather_parts(const Tensor& full, const Tensor& own, const char* what) {
  Impl& m = *impl_;
  for (Unit& u : m.units) m.uc.gather(u, full, own, u.shard_offset, what);
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

std::vector<int64_t> DataParallel::owned_state_offsets() const {
  const Impl& m = *impl_;
  std::vector<int64_t> out;
  for (const Unit& u : m.units)
    if (u.mine_end(m.me) > u.mine_begin(m.me)) out.push_back(m.zero->shards_state() ? u.shard_offset : u.mine_begin(m.me));
  return out;
}

}  // namespace loom::parallel
