// The bits of every layout, pinned (issue 41, item 8): short deterministic gpt-nano runs on
// each way Loom lays out a training step (one process; dp2 with ZeRO 0-3; pp2 under 1F1B,
// interleaved and zero-bubble; tp2 with sequence parallelism; dp2 x pp2 x tp2; synchronous
// parameter servers; bf16 and fp16 precision), each hashed (its metrics' loss columns, its
// final weights and optimizer state as logical tensors) and compared with the hashes in
// tests/fixtures/layout_hashes.json. Each also stops halfway and resumes from its
// checkpoint on the same layout, which must end on the same bits. A change that moves
// code around (the spine of issue 41) must leave every hash as it is; a change that means
// to alter results regenerates the file, and says why, with
//   LOOM_RECORD_LAYOUT_HASHES=1 build/release/tests/layout_hashes_test
// Loom's kernels give the same bits on every x86-64 CPU and thread count, so the hashes
// hold on any machine.
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace loom {
namespace {

const std::string kHashes = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/layout_hashes.json";

struct Layout {
  std::string name;
  int ranks;
  std::string flags;
};

struct Bits {
  std::string losses, weights, optimizer;
};

class LayoutHashes : public Cli {
 protected:
  // Trains `steps` steps of layout `l` as job `job` (resuming when asked): its hashes.
  Bits run(const Layout& l, const std::string& job, int steps, bool resume) {
    const std::string train = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), kCommon, l.flags, " --job.name=", job,
                                  " --training.steps=", steps, resume ? " --resume" : "");
    const Result r = loom(l.ranks == 1 ? train.substr(train.find(" train ") + 1) : cat("launch -n ", l.ranks, " -- ", train));
    EXPECT_EQ(r.code, 0) << l.name << (resume ? " (resumed)" : "") << "\n" << r.out << r.err;
    const std::string step = p(cat("runs/", job, "/checkpoints/step_", steps));
    if (r.code != 0 || !std::filesystem::exists(step)) return {};
    // Each step's loss, learning rate and gradient norm, and the validation loss at each step
    // evaluated (a run's closing evaluation, `final_val_loss`, is the same evaluation at its
    // last step: which key holds it depends on where the run stopped).
    std::istringstream metrics(read_file(p(cat("runs/", job, "/metrics.jsonl"))));
    std::map<int64_t, std::string> trained, evaluations;
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json m = nlohmann::json::parse(line);
      const int64_t at = m["step"];
      if (m.contains("loss")) trained[at] = cat(m["loss"].dump(), " ", m["lr"].dump(), " ", m["grad_norm"].dump());
      for (const char* key : {"val_loss", "final_val_loss"})
        if (m.contains(key)) evaluations[at] = m[key].dump();
    }
    std::string losses;
    for (const auto& [at, v] : trained) losses += cat("step ", at, " ", v, "\n");
    for (const auto& [at, v] : evaluations) losses += cat("val ", at, " ", v, "\n");
    return {sha256_hex(losses), sha256_hex(logical(step, checkpoint::Part::kModel)),
            sha256_hex(logical(step, checkpoint::Part::kOptimizer))};
  }

  static constexpr const char* kCommon =
      " --quiet --parallel.deterministic=true --job.threads=1 --training.global_batch=4 --training.micro_batch=1"
      " --training.eval_every=2 --training.eval_steps=1 --checkpoint.every=2 --checkpoint.keep=5";
};

TEST_F(LayoutHashes, EveryLayoutKeepsItsBitsAndResumesOnThem) {
  const std::string four = " --model.n_layer=4 --model.n_head=4";  // room for 2 stages x 2 chunks, and tp 2
  const std::vector<Layout> layouts = {
      {"one process", 1, ""},
      {"dp2 zero0", 2, " --parallel.zero=0"},
      {"dp2 zero1", 2, " --parallel.zero=1"},
      {"dp2 zero2", 2, " --parallel.zero=2"},
      {"dp2 zero3", 2, " --parallel.zero=3"},
      {"pp2 1f1b", 2, four + " --parallel.pp=2 --parallel.pp_schedule=1f1b"},
      {"pp2 interleaved", 2, four + " --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.virtual_stages=2"},
      {"pp2 zb-h1", 2, four + " --parallel.pp=2 --parallel.pp_schedule=zb-h1"},
      {"tp2 sequence parallel", 2, four + " --parallel.tp=2 --parallel.sequence_parallel=true"},
      {"dp2 pp2 tp2", 8, four + " --parallel.dp=2 --parallel.pp=2 --parallel.tp=2"},
      {"parameter servers sync", 3, " --parallel.ps_servers=1 --parallel.ps_mode=sync"},
      {"bf16", 1, " --training.precision=bf16"},
      {"fp16", 1, " --training.precision=fp16"},
  };
  const bool record = std::getenv("LOOM_RECORD_LAYOUT_HASHES") != nullptr;
  nlohmann::json pinned = nlohmann::json::object();
  if (!record) {
    std::ifstream in(kHashes);
    ASSERT_TRUE(in) << kHashes << ": missing; record it with LOOM_RECORD_LAYOUT_HASHES=1";
    pinned = nlohmann::json::parse(in);
  }
  nlohmann::json now = nlohmann::json::object();
  for (size_t i = 0; i < layouts.size(); ++i) {
    const Layout& l = layouts[i];
    const Bits whole = run(l, cat("w", i), 4, false);
    ASSERT_FALSE(whole.losses.empty()) << l.name;
    // Halfway, then resumed from step 2's checkpoint on the same layout: the same end.
    run(l, cat("r", i), 2, false);
    const Bits resumed = run(l, cat("r", i), 4, true);
    EXPECT_EQ(resumed.weights, whole.weights) << l.name << ": a resumed run ended on other weights";
    EXPECT_EQ(resumed.optimizer, whole.optimizer) << l.name << ": a resumed run ended on another optimizer state";
    EXPECT_EQ(resumed.losses, whole.losses) << l.name << ": a resumed run's losses differ";
    now[l.name] = {{"losses", whole.losses}, {"weights", whole.weights}, {"optimizer", whole.optimizer}};
    if (record) continue;
    ASSERT_TRUE(pinned.contains(l.name)) << l.name << ": no pinned hashes in " << kHashes;
    for (const char* part : {"losses", "weights", "optimizer"})
      EXPECT_EQ(now[l.name][part], pinned[l.name][part]) << l.name << ": its " << part << " changed";
  }
  if (record) {
    std::ofstream(kHashes) << now.dump(2) << "\n";
    std::printf("recorded %zu layouts' hashes in %s\n", layouts.size(), kHashes.c_str());
  }
}

}  // namespace
}  // namespace loom
