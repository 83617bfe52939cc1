// Data parallelism and ZeRO 1-2: units, the micro-step protocol, the sharded update.
// The collectives each unit issues live in dp_comm.cc.
#include "loom/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "parallel/dp_comm.h"
#include "parallel/exact_sum.h"

namespace loom::parallel {

namespace {

// Units from the end of the buffer down, each `target` elements (a multiple of `align`),
// the one at offset 0 taking what is left. Returned in ascending order.
std::vector<Unit> make_units(int64_t numel, double bucket_mb, int size) {
  const int64_t align = 16 * static_cast<int64_t>(size);  // parts stay 64-byte aligned
  int64_t target = static_cast<int64_t>(bucket_mb * (1 << 20) / 4);
  target = std::max(align, target / align * align);
  std::vector<Unit> units;
  for (int64_t end = numel; end > 0;) {
    int64_t begin = end - target >= align ? end - target : 0;
    units.push_back(Unit{.begin = begin, .end = end});
    end = begin;
  }
  std::reverse(units.begin(), units.end());
  for (Unit& u : units) u.part = (u.end - u.begin + size - 1) / size;
  return units;
}

}  // namespace

struct DataParallel::Impl {
  comm::Communicator& comm;
  ParamSet& params;
  DataParallelConfig config;
  std::function<int64_t(int)> final_from;
  int n = 1, me = 0;
  std::vector<Unit> units;  // ascending offsets; launched in descending order
  int64_t shard_numel = 0;  // elements of this rank's parts (ZeRO 1-2)
  Tensor shard_grads;       // ZeRO 2: this rank's summed gradients, its parts in order
  Tensor exact;             // deterministic: kLimbs int64 per gradient element
  std::unique_ptr<optim::Optimizer> optimizer;
  UnitComm uc;

  bool last_micro = false;
  size_t next_unit = 0;  // in launch order (units.size() - 1 - i)
  CommStats stats;

  Impl(comm::Communicator& c, ParamSet& p, const DataParallelConfig& cfg, std::function<int64_t(int)> ff)
      : comm(c), params(p), config(cfg), final_from(std::move(ff)), n(c.size()), me(c.rank()),
        uc{.comm = c, .config = config, .stats = stats} {}  // the members, not the arguments

  Unit& launch_order(size_t i) { return units[units.size() - 1 - i]; }
  bool sharded() const { return config.zero >= 1; }

  // Flat element ranges this rank updates, and where their gradients and state live.
  optim::UpdateSpec update_spec() {
    if (!sharded()) return optim::whole(params);
    optim::UpdateSpec spec{.values = params.values(),
                           .grads = config.zero == 2 ? shard_grads : params.grads(),
                           .state_numel = shard_numel};
    const auto& infos = params.infos();
    size_t pi = 0;
    for (const Unit& u : units) {
      const int64_t b = u.mine_begin(me), e = u.mine_end(me);
      while (pi < infos.size() && infos[pi].offset + infos[pi].numel <= b) ++pi;
      for (size_t q = pi; q < infos.size() && infos[q].offset < e; ++q) {
        const int64_t lo = std::max(b, infos[q].offset), hi = std::min(e, infos[q].offset + infos[q].numel);
        const int64_t local = u.shard_offset + (lo - b);
        spec.segments.push_back({.kind = infos[q].kind, .numel = hi - lo, .value_offset = lo,
                                 .grad_offset = config.zero == 2 ? local : lo, .state_offset = local});
      }
    }
    return spec;
  }

  // A unit whose gradients are final for this micro-step.
  void on_final(Unit& u) {
    float* g = params.grads().data<float>() + u.begin;
    const int64_t len = u.end - u.begin;
    if (config.deterministic) {
      exact_accumulate(g, exact.data<int64_t>() + kLimbs * u.begin, len,
                       cat("gradients [", u.begin, ", ", u.end, ")"));
      std::fill(g, g + len, 0.0f);  // the next micro-step's backward accumulates from zero
    }
    if (last_micro) uc.launch_reduce(u, params.grads(), exact, shard_grads);
  }

  void process_ready(int64_t from) {
    while (next_unit < units.size() && launch_order(next_unit).begin >= from) on_final(launch_order(next_unit++));
  }

  double grad_norm_and_clip(double max_norm) {
    const bool full = config.zero < 2;
    Tensor g = full ? params.grads() : shard_grads;
    double norm = 0;
    if (config.deterministic) {
      int64_t acc[kSquareLimbs] = {};
      exact_accumulate_squares(g.data<float>(), g.numel(), acc);
      if (!full) uc.sum_i64(acc, kSquareLimbs);
      norm = std::sqrt(exact_decode_squares(acc));
    } else if (full) {
      return optim::clip_grad_norm(params, max_norm);  // the single-process computation
    } else {
      double sq = 0;
      const float* d = g.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) sq += static_cast<double>(d[i]) * d[i];
      uc.sum_f64(&sq, 1);
      norm = std::sqrt(sq);
    }
    if (max_norm > 0 && norm > max_norm) {
      const auto coef = static_cast<float>(max_norm / (norm + 1e-6));  // as optim::clip_grad_norm
      float* d = g.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) d[i] *= coef;
    }
    return norm;
  }
};

DataParallel::DataParallel(comm::Communicator& comm, ParamSet& params, const optim::OptimizerConfig& optimizer,
                           const DataParallelConfig& config, std::function<int64_t(int)> final_from)
    : impl_(std::make_unique<Impl>(comm, params, config, std::move(final_from))) {
  Impl& m = *impl_;
  LOOM_CHECK(params.values().defined());
  LOOM_CHECK(params.dtype() == DType::kF32);
  LOOM_CHECK(config.zero >= 0 && config.zero <= 2);
  m.units = make_units(params.numel(), config.bucket_mb, m.n);
  for (Unit& u : m.units) {
    u.shard_offset = m.shard_numel;
    m.shard_numel += u.mine_end(m.me) - u.mine_begin(m.me);
  }
  if (config.zero == 2) m.shard_grads = Tensor::zeros({m.shard_numel}, DType::kF32);
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
}

void DataParallel::begin_step() {
  Impl& m = *impl_;
  m.params.zero_grads();
  if (m.config.deterministic) m.exact.zero();
  m.stats = {};
}

void DataParallel::begin_micro_step(bool last) {
  impl_->last_micro = last;
  impl_->next_unit = 0;
}

void DataParallel::grads_ready(int block) { impl_->process_ready(block < 0 ? 0 : impl_->final_from(block)); }

void DataParallel::end_micro_step() { impl_->process_ready(0); }

double DataParallel::finish_step(double lr, double max_norm) {
  Impl& m = *impl_;
  LOOM_CHECK(m.last_micro && m.next_unit == m.units.size());  // end_micro_step() of the last micro-step ran
  for (Unit& u : m.units) m.uc.complete_reduce(u, m.params.grads(), m.exact, m.shard_grads);
  // ZeRO 2 keeps only its parts (in shard_grads): the full buffer's pages go back to the OS
  // until the next backward writes them.
  if (m.config.zero == 2) release_pages(m.params.grads().raw(), m.params.grads().nbytes());
  const double norm = m.grad_norm_and_clip(max_norm);
  m.optimizer->step(lr);
  if (m.sharded())
    for (Unit& u : m.units) m.uc.gather(u, m.params.values(), m.params.values(), u.mine_begin(m.me));
  return norm;
}

double DataParallel::mean_loss(const std::vector<double>& micro_losses) {
  Impl& m = *impl_;
  std::vector<double> all(micro_losses.size() * static_cast<size_t>(m.n));
  m.uc.all_gather_f64(micro_losses.data(), all.data(), micro_losses.size());
  double sum = 0;
  for (double l : all) sum += l;  // global micro-batch order, as one process sums them
  return sum / static_cast<double>(all.size());
}

CommStats DataParallel::take_stats() { return std::exchange(impl_->stats, {}); }

StateBytes DataParallel::state_bytes() const {
  const Impl& m = *impl_;
  StateBytes b;
  // Measured (resident pages), not assumed: what the rank really holds right now.
  b.params = resident_bytes(m.params.values().raw(), m.params.values().nbytes());
  b.grads = resident_bytes(m.params.grads().raw(), m.params.grads().nbytes());
  if (m.shard_grads.defined()) b.grads += resident_bytes(m.shard_grads.raw(), m.shard_grads.nbytes());
  for (const auto& [name, t] : m.optimizer->state()) b.optimizer += resident_bytes(t.raw(), t.nbytes());
  return b;
}

int64_t DataParallel::optimizer_steps() const { return impl_->optimizer->steps(); }

optim::FlatState DataParallel::empty_optimizer_state() const {
  optim::FlatState s;
  for (const auto& [name, t] : impl_->optimizer->state())
    s.buffers.emplace_back(name, Tensor::zeros({impl_->params.numel()}, t.dtype()));
  return s;
}

optim::FlatState DataParallel::gather_optimizer_state() {
  Impl& m = *impl_;
  optim::FlatState s = empty_optimizer_state();
  s.steps = m.optimizer->steps();
  auto own = m.optimizer->state();
  for (size_t k = 0; k < own.size(); ++k) {
    if (!m.sharded()) {
      s.buffers[k].second.copy_from(own[k].second);
      continue;
    }
    for (Unit& u : m.units) m.uc.gather(u, s.buffers[k].second, own[k].second, u.shard_offset);
  }
  return s;
}

void DataParallel::load_optimizer_state(const optim::FlatState& state) {
  Impl& m = *impl_;
  auto own = m.optimizer->state();
  LOOM_CHECK_EQ(own.size(), state.buffers.size());
  for (size_t k = 0; k < own.size(); ++k) {
    const float* full = state.buffers[k].second.data<float>();
    float* mine = own[k].second.data<float>();
    if (!m.sharded()) {
      std::copy_n(full, m.params.numel(), mine);
      continue;
    }
    for (const Unit& u : m.units)
      std::copy(full + u.mine_begin(m.me), full + u.mine_end(m.me), mine + u.shard_offset);
  }
  m.optimizer->set_steps(state.steps);
}

}  // namespace loom::parallel
