#include "loom/parallel/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/host.h"
#include "loom/nn/gpt.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/schedule.h"
#include "parallel/exact_sum.h"

namespace loom::parallel {
namespace fs = std::filesystem;

namespace {

constexpr double kF32 = 4;
constexpr double kExactSumBytes = kLimbs * sizeof(int64_t);  // exact-sum slots per element

// Bytes as GiB with 3 significant digits, e.g. "0.0123" or "1.2e+04".
std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", bytes / (1 << 30));
  return buf;
}

double file_bytes(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0.0 : static_cast<double>(n);
}

// One token file held as uint16 (the same bytes as the file, less the header), plus the
// file's bytes while it is read.
double token_data_bytes(const MemoryPlanInput& in) {
  const double train = file_bytes(in.train_data), val = in.val_data.empty() ? 0 : file_bytes(in.val_data);
  return train + val + std::max(train, val);
}

// Per stage (and tensor-parallel piece) of a GPT: what it holds, in parameters (before
// ZeRO), and the bytes its micro-batches keep.
struct StageShape {
  double params = 0, largest_block = 0, activations = 0, workspace = 0;
};

StageShape gpt_stage(const MemoryPlanInput& in, int stage) {
  const nn::GptConfig& g = in.model;
  const int pp = in.layout.pp, v = in.layout.v, tp = in.layout.tp;
  const int64_t b = in.micro_batch, t = g.seq_len;
  const nn::GptCounts n = nn::gpt_counts(g, tp);
  const nn::Recompute recompute = in.recompute;
  StageShape s;
  s.largest_block = n.block;
  if (pp == 1) {
    s.params = n.total();
    const nn::ActivationBytes a =
        nn::gpt_activation_bytes(g, g.n_layer, {}, b, t, recompute, true, tp, in.sequence_parallel, in.precision);
    s.activations = a.arena;
    s.workspace = a.workspace + a.staging;
    return s;
  }
  const nn::GptPart part = stage_part(g.n_layer, pp, v, stage);
  auto stage_params = [&](const nn::GptCounts& k) {
    return static_cast<double>(part.blocks.size()) * k.block + (part.embeddings ? k.embeddings : 0) +
           (part.head ? static_cast<double>(g.vocab_size * g.d_model) + k.head : 0);
  };
  s.params = stage_params(n);
  // Each (micro-batch, chunk) in flight keeps its context and its received activation and
  // gradient; the simulator says how many the schedule keeps at once on this stage.
  const Schedule sched =
      make_schedule(schedule_kind_named(in.pp_schedule), pp, static_cast<int>(in.global_batch / (b * in.layout.dp)), v);
  const int in_flight = simulate(sched, {}).peak_in_flight[static_cast<size_t>(stage)];
  const auto chunk_blocks = static_cast<int64_t>(part.blocks.size()) / v;
  const bool sp = in.sequence_parallel;
  const nn::ActivationBytes a = nn::gpt_activation_bytes(g, chunk_blocks, {.embeddings = part.embeddings, .head = part.head},
                                                         b, t, recompute, true, tp, sp, in.precision);
  const double received = static_cast<double>(b * t * g.d_model) / (sp ? tp : 1);  // sequence parallel: this piece's rows
  s.activations = in_flight * (a.arena + 2 * kF32 * received);
  s.workspace = a.workspace + a.staging;
  return s;
}

double mlp_params(const MemoryPlanInput& m) {
  // The images are Fashion-MNIST's 28 x 28 (the only IDX data the mlp model reads).
  const double in = 784, h = static_cast<double>(m.mlp_hidden), k = static_cast<double>(m.mlp_classes);
  const double layers = static_cast<double>(m.mlp_layers);
  return in * h + h + (layers - 1) * (h * h + h) + h * k + k;
}

RankBytes rank_bytes(const MemoryPlanInput& in, int stage) {
  const bool gpt = in.gpt;
  const double dp = static_cast<double>(in.layout.dp);
  const int zero = in.zero;
  const double state_buffers = in.optimizer_buffers;
  StageShape s;
  if (gpt) {
    s = gpt_stage(in, stage);
  } else {
    s.params = mlp_params(in);
    const double h = static_cast<double>(in.mlp_hidden), layers = static_cast<double>(in.mlp_layers);
    s.largest_block = h * h;
    s.activations = kF32 * static_cast<double>(in.micro_batch) * (2 * 784 + 4 * h * layers);
  }
  RankBytes r;
  // ZeRO-3 holds its shard and the blocks it has gathered (two at a time: the one computed
  // and the next); ZeRO-2 likewise for gradients; ZeRO-1 and up shard the optimizer state.
  r.params = kF32 * (zero == 3 ? std::min(s.params, s.params / dp + 2 * s.largest_block) : s.params);
  r.grads = kF32 * (zero >= 2 ? std::min(s.params, s.params / dp + 2 * s.largest_block) : s.params);
  r.optimizer = kF32 * state_buffers * (zero >= 1 ? s.params / dp : s.params);
  r.activations = s.activations;
  r.workspace = s.workspace;
  if (in.deterministic && dp > 1) r.exact_sums = kExactSumBytes * s.params;
  // Saving: a synchronous save writes every rank's share (its 1/dp part of its stage's and
  // piece's parameters and optimizer state) from its own buffers through one buffer of the
  // largest piece; with [checkpoint] async the share is copied into an arena held from the
  // start, at most the same bytes as resuming. Resuming maps, before
  // training starts, the files a rank reads (whole files, for every shard its part meets;
  // it loads in place into its own buffers): at most (1 + buffers) x P, counted here as the
  // larger of the two.
  const double save_bytes = kF32 * (1 + state_buffers) * s.params / dp;
  const double load_bytes = kF32 * (1 + state_buffers) * s.params;
  r.checkpoint = std::max(save_bytes, load_bytes);
  // Evaluation takes nothing more: every rank runs its part forward in the context (and,
  // under ZeRO 3, the gathered blocks) a training micro-step uses (docs/parallelism.md).
  r.data = gpt ? token_data_bytes(in) : 70000.0 * 784 * kF32;
  return r;
}

}  // namespace

double RankBytes::total() const {
  return params + grads + optimizer + activations + workspace + checkpoint + exact_sums + data;
}

MemoryPlan plan_memory(const MemoryPlanInput& in, int world, const std::vector<int>& host_ranks) {
  MemoryPlan plan;
  const int pp = in.layout.pp, dp = in.layout.dp, tp = in.layout.tp;
  for (int s = 0; s < pp; ++s) plan.stages.push_back(rank_bytes(in, s));
  plan.host_ranks = host_ranks;
  for (int r : host_ranks) {
    LOOM_CHECK(r >= 0 && r < world);
    plan.host_bytes += rank_bytes(in, r / (dp * tp)).total();  // parameter servers' ranks past the stages too
  }
  plan.available_bytes = available_memory_bytes();
  plan.data_files = in.train_data + (in.val_data.empty() ? "" : " and " + in.val_data);
  return plan;
}

// "12.3 MiB" or "4.56 GiB".
std::string human(double bytes) {
  return bytes < (1 << 30) ? cat(gib(bytes * 1024), " MiB") : cat(gib(bytes), " GiB");
}

std::string describe(const MemoryPlan& plan) {
  std::string out;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const RankBytes& b = plan.stages[s];
    out += cat("memory per rank", plan.stages.size() > 1 ? cat(" of stage ", s) : std::string(), ": ", human(b.total()),
               " = parameters ", human(b.params), " + gradients ", human(b.grads), " + optimizer ", human(b.optimizer),
               " + activations ", human(b.activations), " + workspace ", human(b.workspace), " + checkpoint ",
               human(b.checkpoint), " + exact sums ", human(b.exact_sums), " + data ", human(b.data), "\n");
  }
  out += cat("memory on this host: ", human(plan.host_bytes), " for ", plan.host_ranks.size(), " rank(s), ",
             human(plan.available_bytes), " available\n");
  return out;
}

void check_fits(const MemoryPlan& plan) {
  if (plan.host_bytes <= plan.available_bytes) return;
  const RankBytes& b = plan.stages[0];
  throw InputError(cat("the run needs ", gib(plan.host_bytes), " GiB on this host (", plan.host_ranks.size(),
                       " rank(s); rank 0: parameters ", gib(b.params), ", gradients ", gib(b.grads), ", optimizer ",
                       gib(b.optimizer), ", activations ", gib(b.activations + b.workspace), ", data ", gib(b.data),
                       " GiB for ", printable(plan.data_files), "), but ",
                       gib(plan.available_bytes), " GiB are available; `loom train --dry-run` shows the plan"));
}

}  // namespace loom::parallel
