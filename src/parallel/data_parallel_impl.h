// DataParallel's state (private to src/parallel): the units gradients are summed in, the
// ZeRO stage (chosen once: ZeroStage, zero_stage.cc) and the exact sums of deterministic
// mode. data_parallel.cc runs the step protocol over it;
// data_parallel_state.cc says what a rank holds and saves.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "loom/parallel/data_parallel.h"
#include "parallel/dp_comm.h"
#include "parallel/exact_sum.h"

namespace loom::parallel {


// Units of [lo, hi) from its end down, each `target` elements (a multiple of `align`), the
// one at lo taking what is left; appended in descending order.
inline void cut_units(int64_t lo, int64_t hi, int64_t target, int64_t align, int group, std::vector<Unit>& units) {
  for (int64_t end = hi; end > lo;) {
    int64_t begin = end - target - lo >= align ? end - target : lo;
    units.push_back(Unit{.begin = begin, .end = end, .group = group});
    end = begin;
  }
}

// Units, in ascending order. ZeRO 3 cuts the blocks and the rest (group 0) separately, so
// that gathering a block gathers nothing else.
inline std::vector<Unit> make_units(int64_t numel, const std::vector<int64_t>& offsets, double bucket_mb, int size,
                             bool by_block) {
  const int64_t align = 16 * static_cast<int64_t>(size);  // parts stay 64-byte aligned
  int64_t target = static_cast<int64_t>(bucket_mb * (1 << 20) / 4);
  target = std::max(align, target / align * align);
  std::vector<Unit> units;
  if (!by_block) {
    cut_units(0, numel, target, align, 0, units);
  } else {
    cut_units(offsets.back(), numel, target, align, 0, units);
    for (size_t b = offsets.size() - 1; b-- > 0;)
      cut_units(offsets[b], offsets[b + 1], target, align, static_cast<int>(b) + 1, units);
    cut_units(0, offsets.front(), target, align, 0, units);
  }
  std::reverse(units.begin(), units.end());
  for (Unit& u : units) u.part = (u.end - u.begin + size - 1) / size;
  return units;
}


namespace detail {

// What a ZeRO stage keeps of the model state and how a step treats it (docs/parallelism.md,
// "ZeRO"), chosen once when DataParallel is built (make_zero_stage, zero_stage.cc). Stage 0
// (this class) keeps everything whole on every rank; each stage above keeps only this
// rank's parts of one thing more: 1 the optimizer state, 2 the summed gradients, 3 the
// parameters, gathered a block at a time before use.
class ZeroStage {
 public:
  virtual ~ZeroStage() = default;
  virtual int stage() const { return 0; }
  // Units cut by block (ZeRO 3: gathering a block gathers nothing else) or straight through.
  virtual bool units_by_block() const { return false; }
  // Sums all-reduced whole (0-1), or reduce-scattered into this rank's parts (2-3).
  virtual bool scatters_gradients() const { return false; }
  // The optimizer keeps state for this rank's parts only (1-3).
  virtual bool shards_state() const { return false; }
  // The stage's own buffers, once the units are cut.
  virtual void allocate(DataParallelImpl&) {}
  // After sync_params' broadcast.
  virtual void after_sync(DataParallelImpl&) {}
  // begin_step: the gradients zeroed, and what the last step left gathered given back.
  virtual void begin_step(DataParallelImpl& m);
  // The block hook's stage part, after the step protocol's own.
  virtual void on_block(DataParallelImpl&, int /*block*/, BlockPhase) {}
  // finish_sums, once every sum has arrived: what goes back before the update.
  virtual void after_sums(DataParallelImpl&) {}
  // The gradients this rank's update reads (whole, or its parts in order).
  virtual Tensor grads(const DataParallelImpl& m) const;
  // The flat ranges this rank updates, and where their values, gradients and state live.
  virtual optim::UpdateSpec update_spec(const DataParallelImpl& m) const;
  // After the update: the updated parameters to every rank that needs them.
  virtual void after_update(DataParallelImpl&) {}
  // This rank's masters of unit u's part (`len` elements): views.
  virtual Tensor part_values(const DataParallelImpl& m, const Unit& u, int64_t len) const;
  // ZeRO 3: every parameter gathered and kept until the next step; what an evaluation
  // gathered given back. Nothing at stages 0-2, which always hold them.
  virtual void materialize(DataParallelImpl&) {}
  virtual void release_gathered(DataParallelImpl&) {}
  // Resident bytes of the stage's own buffers: parameters, gradients.
  virtual std::pair<int64_t, int64_t> own_bytes() const { return {0, 0}; }
};

std::unique_ptr<ZeroStage> make_zero_stage(int stage);

struct DataParallelImpl {
  comm::Communicator& comm;
  ParamSet& params;
  DataParallelConfig config;
  std::vector<int64_t> offsets;  // model blocks
  int n = 1, me = 0;
  std::unique_ptr<ZeroStage> zero;
  std::vector<Unit> units;  // ascending offsets; launched in descending order
  int64_t shard_numel = 0;  // elements of this rank's parts (ZeRO 1-3)
  Tensor exact;             // deterministic: kLimbs int64 per gradient element
  int64_t unsummable = -1;  // deterministic: this step's first flat element exact sums cannot hold
  bool grads_shared = false;  // the gradients lie in memory same-host peers map (alloc_shared)
  UnitComm uc;

  bool last_micro = false;
  bool tied_summed = false;  // this step's sum_tied_gradients() ran: held units may launch
  size_t next_unit = 0;  // in launch order (units.size() - 1 - i)
  CommStats stats;
  std::function<void(const CommSpan&)> observer;
  StageGroups stage_groups;

  DataParallelImpl(comm::Communicator& c, ParamSet& p, const DataParallelConfig& cfg, std::vector<int64_t> off)
      : comm(c), params(p), config(cfg), offsets(std::move(off)), n(c.size()), me(c.rank()),
        zero(make_zero_stage(cfg.zero)),
        uc{.comm = c, .config = config, .stats = stats, .observer = observer,  // the members, not the arguments
           .scatter = zero->scatters_gradients()} {}

  Unit& launch_order(size_t i) { return units[units.size() - 1 - i]; }
  int blocks() const { return static_cast<int>(offsets.size()) - 1; }

  void on_block(int block, BlockPhase phase) {
    const int last = blocks();
    // The head's gradients (ln_f, and its share of the tied wte) are final when the blocks'
    // backward starts; deterministic mode sums them apart from the embeddings' later share,
    // exactly as a pipeline's last stage does.
    if (phase == BlockPhase::kBackward && config.deterministic && block == last - 1) accumulate_rest();
    if (phase == BlockPhase::kBackwardDone) process_ready(block < 0 ? 0 : offsets[block]);
    zero->on_block(*this, block, phase);
  }

  // Deterministic: the gradients outside the blocks into the exact sums, then zero.
  void accumulate_rest() {
    float* g = params.grads().data<float>();
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, offsets.front()}, {offsets.back(), params.numel()}}) {
      accumulate_exactly(g, lo, hi - lo);
      std::fill(g + lo, g + hi, 0.0f);
    }
  }

  // Deterministic: flat gradients [begin, begin + n) into the exact sums, noting the first
  // one they cannot hold (not finite, or too large), which then makes the norm NaN.
  void accumulate_exactly(const float* grads, int64_t begin, int64_t n) {
    const int64_t out = exact_accumulate(grads + begin, exact.data<int64_t>() + kLimbs * begin, n);
    if (out >= 0 && (unsummable < 0 || begin + out < unsummable)) unsummable = begin + out;
  }

  // Calls fn(pointer, count) over this rank's gradients (full or its shard), leaving out
  // the flat ranges stage_groups.skip.
  template <typename Fn>
  void for_each_counted(const Tensor& g, bool full, Fn fn) const {
    const auto& skip = stage_groups.skip;
    auto pieces = [&](int64_t b, int64_t e, float* at) {  // flat [b, e) stored at `at`
      int64_t from = b;
      for (auto [sb, se] : skip) {
        if (se <= from || sb >= se) continue;
        if (sb >= e) break;
        if (sb > from) fn(at + (from - b), sb - from);
        from = std::max(from, se);
        if (from >= e) return;
      }
      if (from < e) fn(at + (from - b), e - from);
    };
    if (full) return pieces(0, params.numel(), g.data<float>());
    for (const Unit& u : units) pieces(u.mine_begin(me), u.mine_end(me), g.data<float>() + u.shard_offset);
  }

  // A unit whose gradients are final for this micro-step. A pipeline's later pieces may meet
  // a unit whose sum is already in flight: nothing more is added to it.
  void on_final(Unit& u, bool may_launch = true) {
    if (u.launched) return;
    float* g = params.grads().data<float>() + u.begin;
    const int64_t len = u.end - u.begin;
    if (config.deterministic) {
      accumulate_exactly(params.grads().data<float>(), u.begin, len);
      std::fill(g, g + len, 0.0f);  // the next micro-step's backward accumulates from zero
    }
    if (last_micro && may_launch && (!u.held || tied_summed)) {
      uc.launch_reduce(u, params.grads(), exact, zero->grads(*this));
      u.launched = true;
    }
  }

  // The units from flat offset `from` up are final for this micro-step; those from
  // `launch_from` up (at least `from`) also for the step.
  void process_ready(int64_t from, int64_t launch_from = 0) {
    while (next_unit < units.size() && launch_order(next_unit).begin >= from) {
      Unit& u = launch_order(next_unit++);
      on_final(u, u.begin >= launch_from);
    }
  }
};

}  // namespace detail
}  // namespace loom::parallel
