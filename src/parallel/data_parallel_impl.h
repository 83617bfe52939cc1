// DataParallel's state (private to src/parallel): the units gradients are summed in, ZeRO
// 3's groups of parameters gathered before use, the exact sums of deterministic mode, and
// the gradient norm. data_parallel.cc runs the step protocol over it; data_parallel_state.cc
// says what a rank holds and saves.
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


struct DataParallel::Impl {
  // ZeRO 3: a model block's parameters (group 0 is the rest).
  struct Group {
    std::vector<size_t> units;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // the flat ranges it covers
    bool gathered = false;  // its gathers launched (and maybe not yet completed)
    bool resident = false;  // ... and completed: params.values() holds it
  };

  comm::Communicator& comm;
  ParamSet& params;
  DataParallelConfig config;
  std::vector<int64_t> offsets;  // model blocks
  int n = 1, me = 0;
  std::vector<Unit> units;  // ascending offsets; launched in descending order
  int64_t shard_numel = 0;  // elements of this rank's parts (ZeRO 1-3)
  Tensor shard_grads;       // ZeRO 2-3: this rank's summed gradients, its parts in order
  Tensor shard_values;      // ZeRO 3: this rank's parameters (the masters), likewise
  std::vector<Group> groups;  // ZeRO 3: index 1 + block
  bool pinned = false;        // ZeRO 3: materialize_params() ran this step
  Tensor exact;             // deterministic: kLimbs int64 per gradient element
  int64_t unsummable = -1;  // deterministic: this step's first flat element exact sums cannot hold
  std::unique_ptr<optim::Optimizer> optimizer;
  UnitComm uc;

  bool last_micro = false;
  bool tied_summed = false;  // this step's sum_tied_gradients() ran: held units may launch
  size_t next_unit = 0;  // in launch order (units.size() - 1 - i)
  CommStats stats;
  std::function<void(const CommSpan&)> observer;
  StageGroups stage_groups;

  Impl(comm::Communicator& c, ParamSet& p, const DataParallelConfig& cfg, std::vector<int64_t> off)
      : comm(c), params(p), config(cfg), offsets(std::move(off)), n(c.size()), me(c.rank()),
        uc{.comm = c, .config = config, .stats = stats, .observer = observer} {}  // the members, not the arguments

  Unit& launch_order(size_t i) { return units[units.size() - 1 - i]; }
  bool sharded() const { return config.zero >= 1; }
  bool zero3() const { return config.zero == 3; }
  int blocks() const { return static_cast<int>(offsets.size()) - 1; }

  // ---- ZeRO 3: parameters gathered before use, released after ----

  void launch_gather(int group) {
    Group& g = groups[group];
    if (g.gathered) return;
    for (size_t i : g.units) uc.launch_gather(units[i], params.values(), shard_values);
    g.gathered = true;
  }

  void need(int group) {
    Group& g = groups[group];
    if (g.resident) return;
    launch_gather(group);
    for (size_t i : g.units) uc.complete_gather(units[i], params.values());
    g.resident = true;
  }

  void release(int group) {
    Group& g = groups[group];
    if (pinned || !g.resident) return;
    for (const auto& [lo, hi] : g.ranges)
      release_pages(params.values().data<float>() + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    g.gathered = g.resident = false;
  }

  // Waits for every gather in flight and gives every gathered page back.
  void release_all() {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      Group& g = groups[gi];
      if (g.gathered && !g.resident) need(static_cast<int>(gi));
    }
    pinned = false;
    release_pages(params.values().raw(), params.values().nbytes());
    for (Group& g : groups) g.gathered = g.resident = false;
  }

  void on_block(int block, BlockPhase phase) {
    const int group = block + 1, last = blocks();  // groups 1..last are the blocks
    switch (phase) {
      case BlockPhase::kForward:
        if (!zero3()) return;
        need(group);
        if (group < last) launch_gather(group + 1);  // the block after (from the rest: block 0)
        return;
      case BlockPhase::kForwardDone:
        if (zero3() && block >= 0 && group != last) release(group);  // the last block is backward's first
        return;
      case BlockPhase::kBackward:
        // The head's gradients (ln_f, and its share of the tied wte) are final when the
        // blocks' backward starts; deterministic mode sums them apart from the embeddings'
        // later share, exactly as a pipeline's last stage does.
        if (config.deterministic && block == last - 1) accumulate_rest();
        if (!zero3()) return;
        need(group);
        if (block > 0) launch_gather(group - 1);
        else if (block < 0 && last > 0) launch_gather(last);
        return;
      case BlockPhase::kBackwardDone:
        process_ready(block < 0 ? 0 : offsets[block]);
        if (zero3()) release(group);
        if (config.zero >= 2 && last_micro) complete_finished();
        return;
    }
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

  // ZeRO 2-3: the units whose sums have arrived give their full gradients' pages back now,
  // so that backward does not hold the whole gradient buffer.
  void complete_finished() {
    for (size_t i = 0; i < next_unit; ++i) {
      Unit& u = launch_order(i);
      if (!u.pending || !u.work.done()) continue;
      uc.complete_reduce(u, params.grads(), exact, shard_grads);
      release_pages(params.grads().data<float>() + u.begin, static_cast<size_t>(u.end - u.begin) * sizeof(float));
    }
  }

  // Flat element ranges this rank updates, and where their gradients and state live.
  optim::UpdateSpec update_spec() {
    if (!sharded()) return optim::whole(params);
    optim::UpdateSpec spec{.values = zero3() ? shard_values : params.values(),
                           .grads = config.zero >= 2 ? shard_grads : params.grads(),
                           .state_numel = shard_numel};
    const auto& infos = params.infos();
    size_t pi = 0;
    for (const Unit& u : units) {
      const int64_t b = u.mine_begin(me), e = u.mine_end(me);
      while (pi < infos.size() && infos[pi].offset + infos[pi].numel <= b) ++pi;
      for (size_t q = pi; q < infos.size() && infos[q].offset < e; ++q) {
        const int64_t lo = std::max(b, infos[q].offset), hi = std::min(e, infos[q].offset + infos[q].numel);
        const int64_t local = u.shard_offset + (lo - b);
        spec.segments.push_back({.kind = infos[q].kind, .numel = hi - lo, .value_offset = zero3() ? local : lo,
                                 .grad_offset = config.zero >= 2 ? local : lo, .state_offset = local});
      }
    }
    return spec;
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
      uc.launch_reduce(u, params.grads(), exact, shard_grads);
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

  double grad_norm_and_clip(double max_norm) {
    const bool full = config.zero < 2;
    Tensor g = full ? params.grads() : shard_grads;
    comm::Communicator* stages = stage_groups.stages;
    double norm = 0;
    if (config.deterministic) {
      // The squares' limbs, then how many ranks met a gradient the exact sums cannot hold:
      // any makes the norm NaN on every rank of the group and every stage.
      int64_t acc[kSquareLimbs + 1] = {};
      for_each_counted(g, full, [&](const float* x, int64_t n) { exact_accumulate_squares(x, n, acc); });
      acc[kSquareLimbs] = unsummable >= 0 ? 1 : 0;
      if (!full) uc.sum_i64(acc, kSquareLimbs + 1, "all-reduce gradient norm");
      else if (n > 1) uc.sum_i64(acc + kSquareLimbs, 1, "all-reduce unsummable gradients");
      if (stages) comm::all_reduce(*stages, {.output = acc, .count = kSquareLimbs + 1, .dtype = DType::kI64});
      if (acc[kSquareLimbs] > 0) return std::numeric_limits<double>::quiet_NaN();
      norm = std::sqrt(exact_decode_squares(acc));
    } else if (full && !stages) {
      return optim::clip_grad_norm(params, max_norm);  // the single-process computation
    } else {
      double sq = 0;
      for_each_counted(g, full, [&](const float* d, int64_t n) {
        for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(d[i]) * d[i];
      });
      if (!full) uc.sum_f64(&sq, 1, "all-reduce gradient norm");
      if (stages) comm::all_reduce(*stages, {.output = &sq, .count = 1, .dtype = DType::kF64});
      norm = std::sqrt(sq);
    }
    if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
      const auto coef = static_cast<float>(max_norm / (norm + 1e-6));  // as optim::clip_grad_norm
      float* d = g.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) d[i] *= coef;
    }
    return norm;
  }
};

}  // namespace loom::parallel
