// The bytes a training run will need, computed before anything large is allocated
// (docs/parallelism.md, "Memory"): per rank of the layout (each pipeline stage's share of
// parameters, gradients and optimizer state after ZeRO, one micro-batch's activations times
// the micro-batches the schedule keeps in flight, the recompute workspace (evaluation
// runs in the step's own), checkpoint shares, exact-sum buffers and the token files), summed over the ranks this
// host runs, against the memory this host has free. `loom train` refuses a run that cannot
// fit; `loom train --dry-run` and `loom plan --config` print the same figures.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/parallel/mesh.h"
#include "loom/nn/gpt.h"

namespace loom::parallel {

// What the plan is computed from (the command line builds it from the resolved config).
struct MemoryPlanInput {
  bool gpt = true;      // else the MLP classifier on Fashion-MNIST's 28 x 28 images
  nn::GptConfig model;  // gpt: the shape
  int64_t mlp_hidden = 0, mlp_layers = 0, mlp_classes = 0;  // mlp: the shape
  MeshShape layout;     // dp resolved (not 0)
  std::string pp_schedule = "1f1b";
  int zero = 0;
  bool deterministic = false, sequence_parallel = false;
  int64_t micro_batch = 1, global_batch = 1;
  nn::Recompute recompute = nn::Recompute::kNone;
  DType precision = DType::kF32;  // of activations and products (training.precision)
  int optimizer_buffers = 2;      // AdamW: exp_avg and exp_avg_sq; SGD: momentum
  std::string train_data, val_data;  // token files: their sizes count ("" for none)
};

struct RankBytes {
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, checkpoint = 0, exact_sums = 0,
         data = 0;
  double total() const;
};

struct MemoryPlan {
  std::vector<RankBytes> stages;  // per pipeline stage, replicas alike (rank 0's is stages[0])
  std::vector<int> host_ranks;    // the job ranks this host runs
  double host_bytes = 0;          // their sum
  double available_bytes = 0;     // what this host has free now (MemAvailable, cgroup limit)
  std::string data_files;         // what the data figure reads, for messages
};

// REQUIRES: `in` for a layout of `world` ranks; `host_ranks` the job ranks on this host.
MemoryPlan plan_memory(const MemoryPlanInput& in, int world, const std::vector<int>& host_ranks);
// Lines for people: each stage's figures in GiB and the host's total against what is free.
std::string describe(const MemoryPlan& plan);
// InputError "needs X GiB on this host (...), Y GiB available" when the plan does not fit.
void check_fits(const MemoryPlan& plan);

}  // namespace loom::parallel
