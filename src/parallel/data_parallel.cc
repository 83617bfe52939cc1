// Data parallelism and ZeRO 1-3: the micro-step protocol and the update (the units and the
// gradient norm are in data_parallel_impl.h; what each ZeRO stage keeps and does,
// zero_stage.cc; what a rank holds and saves, data_parallel_state.cc; the collectives each
// unit issues, dp_comm.cc).
#include "loom/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/core/log.h"
#include "parallel/data_parallel_impl.h"

namespace loom::parallel {

DataParallel::DataParallel(comm::Communicator& comm, ParamSet& params, const DataParallelConfig& config,
                           std::vector<int64_t> block_offsets)
    : impl_(std::make_unique<Impl>(comm, params, config, std::move(block_offsets))) {
  Impl& m = *impl_;
  LOOM_CHECK(params.values().defined());
  LOOM_CHECK(params.dtype() == DType::kF32);
  LOOM_CHECK(config.zero >= 0 && config.zero <= 3);
  LOOM_CHECK(!(config.deterministic && config.param_dtype != DType::kF32));
  LOOM_CHECK_LE(2u, m.offsets.size());
  LOOM_CHECK(std::is_sorted(m.offsets.begin(), m.offsets.end()) && m.offsets.front() >= 0 &&
             m.offsets.back() <= params.numel());
  m.units = make_units(params.numel(), m.offsets, config.bucket_mb, m.n, m.zero->units_by_block());
  for (Unit& u : m.units) {
    u.shard_offset = m.shard_numel;
    m.shard_numel += u.mine_end(m.me) - u.mine_begin(m.me);
  }
  m.zero->allocate(m);
  if (config.deterministic) m.exact = Tensor::zeros({kLimbs * params.numel()}, DType::kI64);
  // ZeRO 0 and 1 all-reduce the f32 gradients in place: in memory the group's same-host
  // ranks map, peers read them there, not through the shared window (docs/parallelism.md,
  // "Gradients in shared memory"), when the units are large enough for that to pay with
  // inputs just written. Where /dev/shm cannot hold them, on any rank, every rank keeps
  // them in private memory.
  if (m.n > 1 && m.zero->stage() <= 1 && !config.deterministic && config.grad_dtype == DType::kF32 &&
      config.bucket_mb >= kSharedGradsMinBucketMb) {
    try {
      auto shared = std::make_shared<comm::SharedBuffer>(comm.alloc_shared(params.grads().nbytes()));
      if (shared->shared()) {
        auto* data = reinterpret_cast<std::byte*>(shared->data());
        const size_t bytes = shared->size();
        params.adopt_grads(Tensor(std::make_shared<Storage>(data, bytes, std::move(shared)), 0,
                                  {params.numel()}, DType::kF32));
        m.grads_shared = true;
      }
    } catch (const comm::CommError& e) {
      log_warn(cat("gradients stay in private memory (peers read them through the shared window): ", e.what()));
    }
  }
}

bool DataParallel::grads_shared() const { return impl_->grads_shared; }

DataParallel::~DataParallel() = default;

int DataParallel::rank() const { return impl_->me; }
int DataParallel::size() const { return impl_->n; }
ParamSet& DataParallel::params() const { return impl_->params; }

void DataParallel::sync_params() {
  Impl& m = *impl_;
  comm::broadcast(m.comm, {.buffer = m.params.values().raw(), .count = static_cast<size_t>(m.params.numel()),
                           .dtype = DType::kF32, .root = 0});
  m.uc.verify_equal(m.params.values(), "parameters after the broadcast from rank 0");
  m.zero->after_sync(m);
}

void DataParallel::begin_step() {
  Impl& m = *impl_;
  m.zero->begin_step(m);
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
  LOOM_CHECK(m.zero->stage() != 3 || groups.tied == nullptr);  // ZeRO 3 gathers by block: refused with pipeline stages
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

Tensor DataParallel::finish_sums() {
  Impl& m = *impl_;
  LOOM_CHECK(m.last_micro && m.next_unit == m.units.size());  // end_micro_step() of the last micro-step ran
  const Tensor g = m.zero->grads(m);
  for (Unit& u : m.units) m.uc.complete_reduce(u, m.params.grads(), m.exact, g);
  m.zero->after_sums(m);
  return g;
}

optim::UpdateSpec DataParallel::update_spec() const { return impl_->zero->update_spec(*impl_); }
void DataParallel::after_update() { impl_->zero->after_update(*impl_); }
bool DataParallel::sums_sharded() const { return impl_->zero->scatters_gradients(); }

void DataParallel::for_each_counted(const std::function<void(const float*, int64_t)>& fn) const {
  const Impl& m = *impl_;
  m.for_each_counted(m.zero->grads(m), !m.zero->scatters_gradients(), fn);
}

bool DataParallel::unsummable() const { return impl_->unsummable >= 0; }
void DataParallel::sum_over_replicas(int64_t* data, size_t count, const char* what) { impl_->uc.sum_i64(data, count, what); }
void DataParallel::sum_over_replicas(double* data, size_t count, const char* what) { impl_->uc.sum_f64(data, count, what); }
const StageGroups& DataParallel::stage_groups() const { return impl_->stage_groups; }
bool DataParallel::deterministic() const { return impl_->config.deterministic; }

DataParallel::Gradients DataParallel::finish_gradients() {
  Impl& m = *impl_;
  LOOM_CHECK(m.last_micro && m.next_unit == m.units.size());
  LOOM_CHECK_EQ(m.zero->stage(), 0);
  for (Unit& u : m.units) m.uc.complete_reduce(u, m.params.grads(), m.exact, m.params.grads());
  if (!m.config.deterministic) return {.sums = m.params.grads()};
  int64_t unsummable = m.unsummable >= 0 ? 1 : 0;
  if (m.n > 1) m.uc.sum_i64(&unsummable, 1, "all-reduce unsummable gradients");
  return {.sums = m.exact, .unsummable = unsummable > 0};
}

std::string DataParallel::first_nonfinite_gradient() {
  Impl& m = *impl_;
  const bool full = !m.zero->scatters_gradients();
  const Tensor g = m.zero->grads(m);
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

}  // namespace loom::parallel
