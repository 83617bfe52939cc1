// The ZeRO stages (docs/parallelism.md, "ZeRO"): each a ZeroStage that keeps one thing more
// as this rank's parts only. Stage 1 shards the optimizer state and all-gathers the updated
// parameters; stage 2 also reduce-scatters the gradients into this rank's parts and gives
// the full buffer's pages back as the sums arrive; stage 3 also keeps only this rank's
// parameters and gathers each block's before its forward and backward, releasing them after.
#include <algorithm>

#include "parallel/data_parallel_impl.h"

namespace loom::parallel::detail {

void ZeroStage::begin_step(DataParallelImpl& m) { m.params.zero_grads(); }

Tensor ZeroStage::grads(const DataParallelImpl& m) const { return m.params.grads(); }

optim::UpdateSpec ZeroStage::update_spec(const DataParallelImpl& m) const { return optim::whole(m.params); }

Tensor ZeroStage::part_values(const DataParallelImpl& m, const Unit& u, int64_t len) const {
  return m.params.values().slice_rows(u.mine_begin(m.me), u.mine_begin(m.me) + len);
}

namespace {

// ZeRO 1: the optimizer's state for this rank's parts; every rank then all-gathers the
// updated parameters.
class ZeroOne : public ZeroStage {
 public:
  int stage() const override { return 1; }
  bool shards_state() const override { return true; }
  optim::UpdateSpec update_spec(const DataParallelImpl& m) const override {
    const bool local_values = values_sharded(), local_grads = scatters_gradients();
    optim::UpdateSpec spec{.values = values(m), .grads = grads(m), .state_numel = m.shard_numel};
    const auto& infos = m.params.infos();
    size_t pi = 0;
    for (const Unit& u : m.units) {
      const int64_t b = u.mine_begin(m.me), e = u.mine_end(m.me);
      while (pi < infos.size() && infos[pi].offset + infos[pi].numel <= b) ++pi;
      for (size_t q = pi; q < infos.size() && infos[q].offset < e; ++q) {
        const int64_t lo = std::max(b, infos[q].offset), hi = std::min(e, infos[q].offset + infos[q].numel);
        const int64_t local = u.shard_offset + (lo - b);
        spec.segments.push_back({.kind = infos[q].kind, .numel = hi - lo, .value_offset = local_values ? local : lo,
                                 .grad_offset = local_grads ? local : lo, .state_offset = local});
      }
    }
    return spec;
  }
  void after_update(DataParallelImpl& m) override {
    for (Unit& u : m.units)
      m.uc.gather(u, m.params.values(), m.params.values(), u.mine_begin(m.me), "all-gather parameters");
  }

 protected:
  // The masters the update writes: the full buffer, or (ZeRO 3) this rank's parts in order.
  virtual bool values_sharded() const { return false; }
  virtual Tensor values(const DataParallelImpl& m) const { return m.params.values(); }
};

// ZeRO 2: also the summed gradients, reduce-scattered into this rank's parts in shard_grads;
// the full buffer is zeroed without being touched (its pages come back as backward writes
// them) and each unit's pages go back once its sum has arrived.
class ZeroTwo : public ZeroOne {
 public:
  int stage() const override { return 2; }
  bool scatters_gradients() const override { return true; }
  void allocate(DataParallelImpl& m) override {
    shard_grads_ = Tensor::zeros({m.shard_numel}, DType::kF32);
    zero_pages(m.params.grads().raw(), m.params.grads().nbytes());  // backward brings pages back
  }
  void begin_step(DataParallelImpl& m) override { zero_pages(m.params.grads().raw(), m.params.grads().nbytes()); }
  void on_block(DataParallelImpl& m, int, BlockPhase phase) override {
    if (phase == BlockPhase::kBackwardDone && m.last_micro) complete_finished(m);
  }
  // Only this rank's parts are kept: the full buffer's pages go back to the OS until the
  // next backward writes them.
  void after_sums(DataParallelImpl& m) override { release_pages(m.params.grads().raw(), m.params.grads().nbytes()); }
  Tensor grads(const DataParallelImpl&) const override { return shard_grads_; }
  std::pair<int64_t, int64_t> own_bytes() const override {
    return {0, resident_bytes(shard_grads_.raw(), shard_grads_.nbytes())};
  }

 private:
  // The units whose sums have arrived give their full gradients' pages back now, so that
  // backward does not hold the whole gradient buffer.
  void complete_finished(DataParallelImpl& m) {
    for (size_t i = 0; i < m.next_unit; ++i) {
      Unit& u = m.launch_order(i);
      if (!u.pending || !u.work.done()) continue;
      m.uc.complete_reduce(u, m.params.grads(), m.exact, shard_grads_);
      release_pages(m.params.grads().data<float>() + u.begin, static_cast<size_t>(u.end - u.begin) * sizeof(float));
    }
  }

  Tensor shard_grads_;  // this rank's summed gradients, its parts in order
};

// ZeRO 3: also the parameters. Each model block's (a group; group 0 is the rest) are
// all-gathered before its forward and backward, the next one's prefetched, and released after.
class ZeroThree : public ZeroTwo {
 public:
  int stage() const override { return 3; }
  bool units_by_block() const override { return true; }
  void allocate(DataParallelImpl& m) override {
    ZeroTwo::allocate(m);
    shard_values_ = Tensor::zeros({m.shard_numel}, DType::kF32);
    groups_.resize(m.offsets.size());
    for (size_t i = 0; i < m.units.size(); ++i) groups_[m.units[i].group].units.push_back(i);
    groups_[0].ranges = {{0, m.offsets.front()}, {m.offsets.back(), m.params.numel()}};
    for (size_t b = 0; b + 1 < m.offsets.size(); ++b) groups_[b + 1].ranges = {{m.offsets[b], m.offsets[b + 1]}};
  }
  void after_sync(DataParallelImpl& m) override {
    const float* full = m.params.values().data<float>();
    for (const Unit& u : m.units)
      std::copy(full + u.mine_begin(m.me), full + u.mine_end(m.me), shard_values_.data<float>() + u.shard_offset);
    release_all(m);
  }
  void begin_step(DataParallelImpl& m) override {
    if (pinned_) release_all(m);
    ZeroTwo::begin_step(m);
  }
  void on_block(DataParallelImpl& m, int block, BlockPhase phase) override {
    const int group = block + 1, last = m.blocks();  // groups 1..last are the blocks
    switch (phase) {
      case BlockPhase::kForward:
        need(m, group);
        if (group < last) launch_gather(m, group + 1);  // the block after (from the rest: block 0)
        break;
      case BlockPhase::kForwardDone:
        if (block >= 0 && group != last) release(m, group);  // the last block is backward's first
        break;
      case BlockPhase::kBackward:
        need(m, group);
        if (block > 0) launch_gather(m, group - 1);
        else if (block < 0 && last > 0) launch_gather(m, last);
        break;
      case BlockPhase::kBackwardDone:
        release(m, group);
        break;
    }
    ZeroTwo::on_block(m, block, phase);
  }
  // No gather may still read the masters the update is about to change, and every gathered
  // block is stale after it.
  void after_sums(DataParallelImpl& m) override {
    ZeroTwo::after_sums(m);
    release_all(m);
  }
  void after_update(DataParallelImpl&) override {}  // gathered block by block when next needed
  Tensor part_values(const DataParallelImpl&, const Unit& u, int64_t len) const override {
    return shard_values_.slice_rows(u.shard_offset, u.shard_offset + len);
  }
  void materialize(DataParallelImpl& m) override {
    for (size_t g = 0; g < groups_.size(); ++g) launch_gather(m, static_cast<int>(g));  // all in flight at once
    for (size_t g = 0; g < groups_.size(); ++g) need(m, static_cast<int>(g));
    pinned_ = true;
  }
  void release_gathered(DataParallelImpl& m) override {
    if (!pinned_) release_all(m);
  }
  std::pair<int64_t, int64_t> own_bytes() const override {
    return {resident_bytes(shard_values_.raw(), shard_values_.nbytes()), ZeroTwo::own_bytes().second};
  }

 protected:
  bool values_sharded() const override { return true; }
  Tensor values(const DataParallelImpl&) const override { return shard_values_; }

 private:
  struct Group {
    std::vector<size_t> units;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // the flat ranges it covers
    bool gathered = false;  // its gathers launched (and maybe not yet completed)
    bool resident = false;  // ... and completed: params.values() holds it
  };

  void launch_gather(DataParallelImpl& m, int group) {
    Group& g = groups_[group];
    if (g.gathered) return;
    for (size_t i : g.units) m.uc.launch_gather(m.units[i], m.params.values(), shard_values_);
    g.gathered = true;
  }
  void need(DataParallelImpl& m, int group) {
    Group& g = groups_[group];
    if (g.resident) return;
    launch_gather(m, group);
    for (size_t i : g.units) m.uc.complete_gather(m.units[i], m.params.values());
    g.resident = true;
  }
  void release(DataParallelImpl& m, int group) {
    Group& g = groups_[group];
    if (pinned_ || !g.resident) return;
    for (const auto& [lo, hi] : g.ranges)
      release_pages(m.params.values().data<float>() + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    g.gathered = g.resident = false;
  }
  // Waits for every gather in flight and gives every gathered page back.
  void release_all(DataParallelImpl& m) {
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Group& g = groups_[gi];
      if (g.gathered && !g.resident) need(m, static_cast<int>(gi));
    }
    pinned_ = false;
    release_pages(m.params.values().raw(), m.params.values().nbytes());
    for (Group& g : groups_) g.gathered = g.resident = false;
  }

  Tensor shard_values_;        // this rank's parameters (the masters), its parts in order
  std::vector<Group> groups_;  // index 1 + block
  bool pinned_ = false;        // materialize() ran this step
};

}  // namespace

std::unique_ptr<ZeroStage> make_zero_stage(int stage) {
  switch (stage) {
    case 0: return std::make_unique<ZeroStage>();
    case 1: return std::make_unique<ZeroOne>();
    case 2: return std::make_unique<ZeroTwo>();
    case 3: return std::make_unique<ZeroThree>();
  }
  check_failed(__FILE__, __LINE__, cat("ZeRO stage ", stage, ": expected 0 to 3"));
}

}  // namespace loom::parallel::detail
