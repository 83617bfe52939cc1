// Data parallelism and ZeRO 1-3: units, the micro-step protocol, the sharded update, and
// ZeRO 3's gather-before-use of each block. The collectives each unit issues live in
// dp_comm.cc.
#include "loom/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/loss_scale.h"
#include "parallel/dp_comm.h"
#include "parallel/exact_sum.h"

namespace loom::parallel {

namespace {

// Units of [lo, hi) from its end down, each `target` elements (a multiple of `align`), the
// one at lo taking what is left; appended in descending order.
void cut_units(int64_t lo, int64_t hi, int64_t target, int64_t align, int group, std::vector<Unit>& units) {
  for (int64_t end = hi; end > lo;) {
    int64_t begin = end - target - lo >= align ? end - target : lo;
    units.push_back(Unit{.begin = begin, .end = end, .group = group});
    end = begin;
  }
}

// Units, in ascending order. ZeRO 3 cuts the blocks and the rest (group 0) separately, so
// that gathering a block gathers nothing else.
std::vector<Unit> make_units(int64_t numel, const std::vector<int64_t>& offsets, double bucket_mb, int size,
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

}  // namespace

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

DataParallel::DataParallel(comm::Communicator& comm, ParamSet& params, const optim::OptimizerConfig& optimizer,
                           const DataParallelConfig& config, std::vector<int64_t> block_offsets)
    : impl_(std::make_unique<Impl>(comm, params, config, std::move(block_offsets))) {
  Impl& m = *impl_;
  LOOM_CHECK(params.values().defined());
  LOOM_CHECK(params.dtype() == DType::kF32);
  LOOM_CHECK(config.zero >= 0 && config.zero <= 3);
  LOOM_CHECK(!(config.deterministic && config.param_dtype != DType::kF32));
  LOOM_CHECK_LE(2u, m.offsets.size());
  LOOM_CHECK(std::is_sorted(m.offsets.begin(), m.offsets.end()) && m.offsets.front() >= 0 &&
             m.offsets.back() <= params.numel());
  m.units = make_units(params.numel(), m.offsets, config.bucket_mb, m.n, m.zero3());
  for (Unit& u : m.units) {
    u.shard_offset = m.shard_numel;
    m.shard_numel += u.mine_end(m.me) - u.mine_begin(m.me);
  }
  if (config.zero >= 2) {
    m.shard_grads = Tensor::zeros({m.shard_numel}, DType::kF32);
    zero_pages(params.grads().raw(), params.grads().nbytes());  // backward brings pages back
  }
  if (m.zero3()) {
    m.shard_values = Tensor::zeros({m.shard_numel}, DType::kF32);
    m.groups.resize(m.offsets.size());
    for (size_t i = 0; i < m.units.size(); ++i) m.groups[m.units[i].group].units.push_back(i);
    m.groups[0].ranges = {{0, m.offsets.front()}, {m.offsets.back(), params.numel()}};
    for (size_t b = 0; b + 1 < m.offsets.size(); ++b) m.groups[b + 1].ranges = {{m.offsets[b], m.offsets[b + 1]}};
  }
  if (config.deterministic) m.exact = Tensor::zeros({kLimbs * params.numel()}, DType::kI64);
  m.optimizer = optim::make_optimizer(optimizer, m.update_spec());
}

DataParallel::~DataParallel() = default;

int DataParallel::rank() const { return impl_->me; }
int DataParallel::size() const { return impl_->n; }

void DataParallel::sync_params() {
  Impl& m = *impl_;
  comm::broadcast(m.comm, {.buffer = m.params.values().raw(), .count = static_cast<size_t>(m.params.numel()),
                           .dtype = DType::kF32, .root = 0});
  m.uc.verify_equal(m.params.values(), "parameters after the broadcast from rank 0");
  if (!m.zero3()) return;
  const float* full = m.params.values().data<float>();
  for (const Unit& u : m.units)
    std::copy(full + u.mine_begin(m.me), full + u.mine_end(m.me), m.shard_values.data<float>() + u.shard_offset);
  m.release_all();
}

void DataParallel::begin_step() {
  Impl& m = *impl_;
  if (m.pinned) m.release_all();
  // ZeRO 2-3 zero the gradients without touching them: their pages come back as backward
  // writes them.
  if (m.config.zero >= 2) zero_pages(m.params.grads().raw(), m.params.grads().nbytes());
  else m.params.zero_grads();
  if (m.config.deterministic) m.exact.zero();
  m.unsummable = -1;
  m.stats = {};
  m.tied_summed = false;
  for (Unit& u : m.units) u.launched = false;
}

void DataParallel::begin_micro_step(bool last) {
  impl_->last_micro = last;
  impl_->next_unit = 0;
}

void DataParallel::on_block(int block, BlockPhase phase) { impl_->on_block(block, phase); }

void DataParallel::end_micro_step(int from_block) {
  Impl& m = *impl_;
  m.process_ready(0, m.last_micro && from_block >= 0 ? m.offsets[static_cast<size_t>(from_block)] : 0);
}

void DataParallel::set_stage_groups(const StageGroups& groups) {
  Impl& m = *impl_;
  LOOM_CHECK(!m.zero3() || groups.tied == nullptr);  // ZeRO 3 gathers by block: refused with pipeline stages
  LOOM_CHECK(groups.tied_begin <= groups.tied_end && groups.tied_end <= m.params.numel());
  for (size_t i = 0; i < groups.skip.size(); ++i)
    LOOM_CHECK(groups.skip[i].first <= groups.skip[i].second && groups.skip[i].second <= m.params.numel() &&
               (i == 0 || groups.skip[i - 1].second <= groups.skip[i].first));
  m.stage_groups = groups;
  for (Unit& u : m.units)
    u.held = groups.tied != nullptr && u.begin < groups.tied_end && groups.tied_begin < u.end;
}

void DataParallel::sum_tied_gradients() {
  Impl& m = *impl_;
  m.tied_summed = true;
  const StageGroups& g = m.stage_groups;
  if (g.tied == nullptr || g.tied_end == g.tied_begin) return;
  const auto n = static_cast<size_t>(g.tied_end - g.tied_begin);
  if (m.config.deterministic)  // integer limbs: the exact sum, in any order
    comm::all_reduce(*g.tied, {.output = m.exact.data<int64_t>() + kLimbs * g.tied_begin, .count = kLimbs * n,
                               .dtype = DType::kI64});
  else  // two ranks: a + b on both
    comm::all_reduce(*g.tied, {.output = m.params.grads().data<float>() + g.tied_begin, .count = n, .dtype = DType::kF32});
}

double DataParallel::finish_step(double lr, double max_norm, double loss_scale) {
  Impl& m = *impl_;
  LOOM_CHECK(m.last_micro && m.next_unit == m.units.size());  // end_micro_step() of the last micro-step ran
  for (Unit& u : m.units) m.uc.complete_reduce(u, m.params.grads(), m.exact, m.shard_grads);
  // ZeRO 2-3 keep only their parts (in shard_grads): the full buffer's pages go back to the
  // OS until the next backward writes them.
  if (m.config.zero >= 2) release_pages(m.params.grads().raw(), m.params.grads().nbytes());
  // ZeRO 3: no gather may still read the masters the update is about to change, and every
  // gathered block is stale after it.
  if (m.zero3()) m.release_all();
  if (loss_scale != 1) {  // a power of two: the division is exact, and keeps an overflow infinite
    LOOM_CHECK(optim::is_power_of_two(loss_scale));
    const Tensor g = m.config.zero < 2 ? m.params.grads() : m.shard_grads;
    const auto inv = static_cast<float>(1 / loss_scale);
    float* d = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) d[i] *= inv;
  }
  const double norm = m.grad_norm_and_clip(max_norm);
  if (!std::isfinite(norm)) return norm;  // every rank of the group sees the same norm
  m.optimizer->step(lr);
  if (m.config.zero == 1 || m.config.zero == 2)
    for (Unit& u : m.units) m.uc.gather(u, m.params.values(), m.params.values(), u.mine_begin(m.me), "all-gather parameters");
  return norm;
}

DataParallel::Gradients DataParallel::finish_gradients() {
  Impl& m = *impl_;
  LOOM_CHECK(m.last_micro && m.next_unit == m.units.size());
  LOOM_CHECK_EQ(m.config.zero, 0);
  for (Unit& u : m.units) m.uc.complete_reduce(u, m.params.grads(), m.exact, m.shard_grads);
  if (!m.config.deterministic) return {.sums = m.params.grads()};
  int64_t unsummable = m.unsummable >= 0 ? 1 : 0;
  if (m.n > 1) m.uc.sum_i64(&unsummable, 1, "all-reduce unsummable gradients");
  return {.sums = m.exact, .unsummable = unsummable > 0};
}

std::string DataParallel::first_nonfinite_gradient() {
  Impl& m = *impl_;
  const bool full = m.config.zero < 2;
  const Tensor g = full ? m.params.grads() : m.shard_grads;
  // This rank's first, as a flat offset (doubles hold every offset exactly); then the
  // group's smallest.
  double first = std::numeric_limits<double>::infinity();
  auto scan = [&](int64_t flat_begin, const float* x, int64_t n) {
    for (int64_t i = 0; i < n && flat_begin + i < first; ++i)
      if (!std::isfinite(x[i])) first = static_cast<double>(flat_begin + i);
  };
  if (full) {
    scan(0, g.data<float>(), g.numel());
  } else {
    for (const Unit& u : m.units) scan(u.mine_begin(m.me), g.data<float>() + u.shard_offset, u.mine_end(m.me) - u.mine_begin(m.me));
  }
  // Deterministic mode summed only what its exact sums hold: the rest was noted as it came.
  if (m.unsummable >= 0) first = std::min(first, static_cast<double>(m.unsummable));
  std::vector<double> all(static_cast<size_t>(m.n));
  m.uc.all_gather_f64(&first, all.data(), 1, "all-gather first non-finite gradient");
  first = *std::min_element(all.begin(), all.end());
  if (!std::isfinite(first)) return "";
  const auto at = static_cast<int64_t>(first);
  for (const ParamInfo& p : m.params.infos())
    if (at >= p.offset && at < p.offset + p.numel) return p.name;
  return "";
}

void DataParallel::materialize_params() {
  Impl& m = *impl_;
  if (!m.zero3()) return;
  for (size_t g = 0; g < m.groups.size(); ++g) m.launch_gather(static_cast<int>(g));  // all in flight at once
  for (size_t g = 0; g < m.groups.size(); ++g) m.need(static_cast<int>(g));
  m.pinned = true;
}

double DataParallel::mean_loss(const std::vector<double>& micro_losses) {
  Impl& m = *impl_;
  std::vector<double> all(micro_losses.size() * static_cast<size_t>(m.n));
  m.uc.all_gather_f64(micro_losses.data(), all.data(), micro_losses.size(), "all-gather losses");
  double sum = 0;
  for (double l : all) sum += l;  // global micro-batch order, as one process sums them
  return sum / static_cast<double>(all.size());
}

CommStats DataParallel::take_stats() { return std::exchange(impl_->stats, {}); }

void DataParallel::set_comm_observer(std::function<void(const CommSpan&)> observer) {
  impl_->observer = std::move(observer);
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
