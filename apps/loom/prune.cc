// `loom prune`: magnitude pruning of a GPT's linear layers (docs/serving.md, "Pruning";
// loom/serve/prune.h), written as a new checkpoint.
#include <cstdio>

#include "commands.h"
#include "infer.h"
#include "loom/serve/gpt_loading.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/error.h"
#include "loom/serve/prune.h"
#include "loom/checkpoint/outputs.h"

namespace loom::app {

int run_prune(const PruneArgs& a) {
  if (!(a.sparsity >= 0 && a.sparsity < 1))
    throw InputError(cat("--sparsity ", a.sparsity, ": expected the share of weights to remove, in [0, 1)"));
  const serve::Structure structure = serve::structure_named(a.structured);
  checkpoint::check_output_root("--out", a.out, {a.checkpoint});
  Config c = inference_config(a.config, a.overrides);
  const checkpoint::Checkpoint ck = checkpoint::Checkpoint::open(a.checkpoint);
  std::unique_ptr<nn::Gpt> gpt = serve::load_gpt(ck, c.i("model.n_head"));
  const serve::Pruned pruned = serve::prune_gpt(*gpt, a.sparsity, structure);
  const int64_t zeroed = pruned.removed, total = pruned.total, zeros = pruned.zeros;
  const nn::GptConfig& g = gpt->config();
  const nlohmann::json state = {
      {"model", {{"kind", "gpt"}, {"n_layer", g.n_layer}, {"n_head", g.n_head}, {"d_model", g.d_model},
                 {"seq_len", g.seq_len}, {"vocab_size", g.vocab_size}}},
      {"pruned", {{"from", ck.path()}, {"sparsity", a.sparsity}, {"structured", a.structured}}}};
  const std::string dir = checkpoint::save(a.out, 0, gpt->params(), nullptr, state, {.files = ck.extra_files()});
  std::printf("pruned %s: %lld of %lld linear weights removed (%.1f%%; %lld are zero in all), %s; wrote %s\n",
              a.structured == "none" ? "by magnitude" : cat("by ", a.structured).c_str(), static_cast<long long>(zeroed),
              static_cast<long long>(total), 100.0 * static_cast<double>(zeroed) / static_cast<double>(total),
              static_cast<long long>(zeros), a.structured == "heads" ? "the MLPs untouched" : "every block's layers",
              dir.c_str());
  return 0;
}

}  // namespace loom::app
