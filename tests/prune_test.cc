// `loom prune` and fine-tuning that keeps its zeros (docs/serving.md, "Pruning"): each kind
// removes exactly what it says from every layer it touches and nothing else, the result
// evaluates and trains, the zeros survive data-parallel fine-tuning, and bad input is a
// one-line error.
#include <cmath>

#include "cli_fixture.h"
#include "loom/nn/gpt.h"

namespace loom {
namespace {

const nn::GptConfig kNano{.n_layer = 2, .n_head = 2, .d_model = 64, .seq_len = 64, .vocab_size = 256};

std::unique_ptr<nn::Gpt> load(const std::string& path) {
  auto gpt = std::make_unique<nn::Gpt>(kNano);
  checkpoint::Checkpoint::open(path).load_params(gpt->params());
  return gpt;
}

Tensor param(const nn::Gpt& g, const std::string& name) { return g.params().value(g.params().find(name)); }

int64_t zeros(const Tensor& t) { return std::count(t.data<float>(), t.data<float>() + t.numel(), 0.0f); }

// Output channels (columns of an (in, out) weight) that are zero throughout.
std::vector<int64_t> zero_columns(const Tensor& w) {
  std::vector<int64_t> cols;
  for (int64_t j = 0; j < w.dim(1); ++j) {
    bool all = true;
    for (int64_t i = 0; i < w.dim(0) && all; ++i) all = w.data<float>()[i * w.dim(1) + j] == 0.0f;
    if (all) cols.push_back(j);
  }
  return cols;
}

const char* kLinears[] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

TEST_F(Cli, PruneRemovesWhatEachKindSaysAndFineTuningKeepsTheZeros) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=base")).code, 0);
  const auto base = load(p("runs/base"));
  for (const std::string kind : {"none", "rows", "heads"}) {
    Result r = loom(cat("prune --checkpoint ", p("runs/base"), " --sparsity 0.5 --structured ", kind, " --out ", p(kind)));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto pruned = load(p(kind));
    for (int blk = 0; blk < 2; ++blk)
      for (const char* layer : kLinears) {
        const std::string name = cat("transformer.h.", blk, ".", layer);
        const Tensor w = param(*pruned, name + ".weight"), w0 = param(*base, name + ".weight");
        const Tensor b = param(*pruned, name + ".bias");
        // Pruning only zeroes: every other weight is the base's.
        for (int64_t i = 0; i < w.numel(); ++i)
          if (w.data<float>()[i] != 0.0f) {
            ASSERT_EQ(w.data<float>()[i], w0.data<float>()[i]) << name;
          }
        const bool attention = std::string(layer).starts_with("attn");
        if (kind == "none") {
          EXPECT_GE(zeros(w), w.numel() / 2) << name;
          EXPECT_LE(zeros(w), w.numel() / 2 + zeros(w0)) << name;
        } else if (kind == "rows") {
          const std::vector<int64_t> cols = zero_columns(w);
          EXPECT_EQ(static_cast<int64_t>(cols.size()), w.dim(1) / 2) << name;
          for (int64_t j : cols) EXPECT_EQ(b.data<float>()[j], 0.0f) << name << " column " << j;
        } else if (!attention) {
          EXPECT_EQ(zeros(w), zeros(w0)) << name << ": heads pruning leaves the MLP alone";
        } else if (name.ends_with("c_attn")) {  // one of 2 heads: its q, k and v columns (3 x 32)
          EXPECT_EQ(zero_columns(w).size(), 96u) << name;
        } else {  // that head's 32 input rows of the output projection
          EXPECT_EQ(zeros(w), 32 * 64) << name;
        }
      }
    const Result e = loom(cat("eval --checkpoint ", p(kind), " --data ", p("val.bin")));
    ASSERT_EQ(e.code, 0) << e.err;
    EXPECT_NE(e.out.find("\"loss\": "), std::string::npos);
  }

  // Two data-parallel ranks fine-tune the row-pruned model: every zero stays, the rest learns.
  Result r = loom(cat("launch -n 2 -- ", LOOM_BINARY_DIR, "/loom train ", p("nano.toml"),
                      " --quiet --job.name=ft --training.keep_zeros=true --init-from ", p("rows")));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto before = load(p("rows")), after = load(p("runs/ft"));
  int64_t kept = 0, changed = 0;
  for (const ParamInfo& info : before->params().infos()) {
    if (info.kind != ParamKind::kWeight && info.kind != ParamKind::kBias) continue;
    const float* x = before->params().values().data<float>() + info.offset;
    const float* y = after->params().values().data<float>() + info.offset;
    for (int64_t i = 0; i < info.numel; ++i) {
      if (x[i] == 0.0f) {
        ASSERT_EQ(y[i], 0.0f) << info.name << " element " << i << " grew back";
        ++kept;
      } else {
        changed += y[i] != x[i] ? 1 : 0;
      }
    }
  }
  EXPECT_GT(kept, 40000);
  EXPECT_GT(changed, 40000) << "fine-tuning changed the weights left";
}

TEST_F(Cli, PruneAndKeepZerosRefuseWhatCannotWork) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=base --training.steps=1")).code, 0);
  const std::string ck = p("runs/base");
  expect_bad_input(cat("prune --checkpoint ", ck, " --sparsity 1 --out ", p("x")), {"--sparsity 1", "[0, 1)"});
  expect_bad_input(cat("prune --checkpoint ", ck, " --sparsity -0.1 --out ", p("x")), {"--sparsity -0.1"});
  expect_bad_input(cat("prune --checkpoint ", ck, " --structured columns --out ", p("x")), {"columns", "none, rows or heads"});
  expect_bad_input(cat("prune --checkpoint ", p("missing"), " --out ", p("x")), {p("missing")});
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=k --training.keep_zeros=true"), {"keep_zeros", "--init-from"});
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=k --training.keep_zeros=true --parallel.zero=3 --init-from ", ck),
                   {"keep_zeros", "parallel.zero = 3"});
  EXPECT_FALSE(std::filesystem::exists(p("x")));
}

}  // namespace
}  // namespace loom
