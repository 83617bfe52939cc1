#include "memory_plan.h"

namespace loom::app {

MemoryPlan plan_memory(const TrainConfig& t, int world, const std::vector<int>& host_ranks) {
  const bool gpt = t.model.kind == "gpt";
  parallel::MemoryPlanInput in{
      .gpt = gpt,
      .mlp_hidden = gpt ? 0 : t.model.hidden,
      .mlp_layers = gpt ? 0 : t.model.n_hidden,
      .mlp_classes = gpt ? 0 : t.model.classes,
      .layout = t.parallel.layout,
      .pp_schedule = t.parallel.pp_schedule,
      .zero = t.parallel.zero,
      .deterministic = t.parallel.deterministic,
      .sequence_parallel = t.parallel.sequence_parallel,
      .micro_batch = t.training.micro_batch,
      .global_batch = t.training.global_batch,
      .recompute = t.training.recompute,
      .precision = t.training.precision,
      .optimizer_buffers = t.parallel.step.optimizer.kind == "adamw" ? 2 : 1,
      .train_data = t.data.train,
      .val_data = t.data.val};
  if (gpt) in.model = t.model.gpt;
  return parallel::plan_memory(in, world, host_ranks);
}

}  // namespace loom::app
