#include "memory_plan.h"

#include <algorithm>

namespace loom::app {

int layout_ranks(const Config& c, int fallback) {
  const int64_t dp = c.i("parallel.dp"), tp = c.i("parallel.tp"), pp = c.i("parallel.pp"), most = int64_t{1} << 20;
  if (dp > 0 && dp <= most && tp > 0 && tp <= most && pp > 0 && pp <= most && dp * tp * pp <= most)
    return static_cast<int>(dp * tp * pp + std::clamp<int64_t>(c.i("parallel.ps_servers"), 0, most));
  return fallback;
}

MemoryPlan plan_memory(const Config& c, int world, const std::vector<int>& host_ranks) {
  const bool gpt = model_kind(c) == "gpt";
  parallel::MemoryPlanInput in{
      .gpt = gpt,
      .mlp_hidden = gpt ? 0 : c.i("model.hidden"),
      .mlp_layers = gpt ? 0 : c.i("model.n_layer"),
      .mlp_classes = gpt ? 0 : c.i("model.vocab_size"),
      .layout = {.dp = static_cast<int>(c.i("parallel.dp")), .pp = static_cast<int>(c.i("parallel.pp")),
                 .v = static_cast<int>(c.i("parallel.virtual_stages")), .tp = static_cast<int>(c.i("parallel.tp"))},
      .pp_schedule = c.s("parallel.pp_schedule"),
      .zero = static_cast<int>(c.i("parallel.zero")),
      .deterministic = c.b("parallel.deterministic"),
      .sequence_parallel = c.b("parallel.sequence_parallel"),
      .micro_batch = c.i("training.micro_batch"),
      .global_batch = c.i("training.global_batch"),
      .recompute = nn::recompute_named(c.s("training.recompute")),
      .precision = precision_format(c.s("training.precision")),
      .optimizer_buffers = c.s("training.optimizer") == "adamw" ? 2 : 1,
      .train_data = c.s("data.train"),
      .val_data = c.s("data.val")};
  if (gpt)
    in.model = {.n_layer = c.i("model.n_layer"), .n_head = c.i("model.n_head"), .d_model = c.i("model.d_model"),
                .seq_len = c.i("model.seq_len"), .vocab_size = c.i("model.vocab_size")};
  return parallel::plan_memory(in, world, host_ranks);
}

}  // namespace loom::app
