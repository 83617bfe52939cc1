// The step's update (loom/parallel/optimizer_step.h): the loss scale out, the global norm
// and clipping, the optimizer, the parameters back to every rank.
#include "loom/parallel/optimizer_step.h"

#include <cmath>
#include <limits>

#include "loom/optim/loss_scale.h"
#include "parallel/dp_comm.h"
#include "parallel/exact_sum.h"

namespace loom::parallel {

OptimizerStep::OptimizerStep(DataParallel& dp, const optim::OptimizerConfig& config)
    : dp_(dp), params_(dp.params()), optimizer_(optim::make_optimizer(config, dp.update_spec())) {}

OptimizerStep::~OptimizerStep() = default;

double OptimizerStep::step(double lr, double max_norm, double loss_scale) {
  const Tensor g = dp_.finish_sums();
  if (loss_scale != 1) {  // a power of two: the division is exact, and keeps an overflow infinite
    LOOM_CHECK(optim::is_power_of_two(loss_scale));
    const auto inv = static_cast<float>(1 / loss_scale);
    float* d = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) d[i] *= inv;
  }
  const double norm = norm_and_clip(g, max_norm);
  if (!std::isfinite(norm)) return norm;  // every rank of the group sees the same norm
  optimizer_->step(lr);
  dp_.after_update();
  return norm;
}

// Each rank's squares of what it counts (its summed gradients, less what another rank of the
// stage groups counts), summed over the replicas when the sums are sharded and over the
// stage groups; exactly, as integer limbs, in deterministic mode.
double OptimizerStep::norm_and_clip(const Tensor& g, double max_norm) {
  const bool sharded = dp_.sums_sharded();
  comm::Communicator* stages = dp_.stage_groups().stages;
  double norm = 0;
  if (dp_.deterministic()) {
    // The squares' limbs, then how many ranks met a gradient the exact sums cannot hold:
    // any makes the norm NaN on every rank of the group and every stage.
    int64_t acc[kSquareLimbs + 1] = {};
    dp_.for_each_counted([&](const float* x, int64_t n) { exact_accumulate_squares(x, n, acc); });
    acc[kSquareLimbs] = dp_.unsummable() ? 1 : 0;
    if (sharded) dp_.sum_over_replicas(acc, kSquareLimbs + 1, "all-reduce gradient norm");
    else if (dp_.size() > 1) dp_.sum_over_replicas(acc + kSquareLimbs, 1, "all-reduce unsummable gradients");
    if (stages) comm::all_reduce(*stages, {.output = acc, .count = kSquareLimbs + 1, .dtype = DType::kI64});
    if (acc[kSquareLimbs] > 0) return std::numeric_limits<double>::quiet_NaN();
    norm = std::sqrt(exact_decode_squares(acc));
  } else if (!sharded && !stages) {
    return optim::clip_grad_norm(params_, max_norm);  // the single-process computation
  } else {
    double sq = 0;
    dp_.for_each_counted([&](const float* d, int64_t n) {
      for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(d[i]) * d[i];
    });
    if (sharded) dp_.sum_over_replicas(&sq, 1, "all-reduce gradient norm");
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

int64_t OptimizerStep::steps() const { return optimizer_->steps(); }
void OptimizerStep::set_steps(int64_t steps) { optimizer_->set_steps(steps); }

int64_t OptimizerStep::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : optimizer_->state()) bytes += resident_bytes(t.raw(), t.nbytes());
  return bytes;
}

optim::FlatState OptimizerStep::gather_state() {
  optim::FlatState s;
  s.steps = optimizer_->steps();
  for (const auto& [name, own] : optimizer_->state()) {
    s.buffers.emplace_back(name, Tensor::zeros({params_.numel()}, own.dtype()));
    if (dp_.shards_state()) dp_.gather_parts(s.buffers.back().second, own, "all-gather optimizer state");
    else s.buffers.back().second.copy_from(own);
  }
  return s;
}

optim::RangeState OptimizerStep::owned_state() const {
  const std::vector<std::pair<int64_t, int64_t>> ranges = dp_.owned_ranges();
  const std::vector<int64_t> at = dp_.owned_state_offsets();  // where each part is in the state
  optim::RangeState s{.ranges = ranges, .steps = optimizer_->steps()};
  for (const auto& [name, own] : optimizer_->state()) {
    std::vector<Tensor> views;
    for (size_t i = 0; i < ranges.size(); ++i)
      views.push_back(own.slice_rows(at[i], at[i] + ranges[i].second - ranges[i].first));
    s.buffers.emplace_back(name, std::move(views));
  }
  return s;
}

optim::RangeState OptimizerStep::kept_state() const {
  if (dp_.shards_state()) return owned_state();
  optim::RangeState s{.ranges = {{0, params_.numel()}}, .steps = optimizer_->steps()};
  for (const auto& [name, own] : optimizer_->state()) s.buffers.push_back({name, {own}});
  return s;
}

}  // namespace loom::parallel
