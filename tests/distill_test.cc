// Distillation ([training] teacher, docs/serving.md "Distillation"): the teacher's softened
// logits change what the student learns, alpha = 0 is plain training, every parallel layout
// (data with ZeRO, tensor, pipeline) trains the distilled student as one process does, and
// bad settings are one-line errors.
#include "cli_fixture.h"

namespace loom {
namespace {

TEST_F(Cli, DistillationMixesTheTeacherInAndEveryLayoutAgrees) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=teacher --training.steps=12")).code, 0);
  const std::string common = cat(" --quiet --training.micro_batch=2 --training.eval_every=3 --training.teacher=",
                                 p("runs/teacher"), " --training.distill_temperature=2");
  auto train = [&](const std::string& flags, int ranks = 1) {
    const std::string cmd = cat(LOOM_BINARY_DIR, "/loom train ", p("nano.toml"), flags);
    Result r = loom(ranks == 1 ? cmd.substr(cmd.find(" train ") + 1) : cat("launch -n ", ranks, " -- ", cmd));
    EXPECT_EQ(r.code, 0) << flags << "\n" << r.out << r.err;
    return read_file(p(cat("runs/", flags.substr(flags.find("--job.name=") + 11, flags.find(' ', flags.find("--job.name=")) -
                                                                                      flags.find("--job.name=") - 11),
                           "/metrics.jsonl")));
  };
  const std::string one = train(common + " --job.name=one ");
  const std::string plain = train(" --quiet --training.micro_batch=2 --training.eval_every=3 --job.name=plain ");
  const std::string alpha0 = train(common + " --job.name=alpha0 --training.distill_alpha=0 ");
  ASSERT_EQ(column(one, "loss").size(), 6u);
  // The teacher is in the loss from the first step, and the student it trains differs.
  EXPECT_GT(std::fabs(std::stod(column(one, "loss")[0]) - std::stod(column(plain, "loss")[0])), 1e-3);
  EXPECT_NE(column(one, "val_loss"), column(plain, "val_loss"));
  // alpha = 0: the same loss through the distillation path's arithmetic.
  expect_columns_near(plain, alpha0, {"loss", "grad_norm", "val_loss"}, 1e-5, "alpha 0");
  for (const auto& [flags, what] : std::vector<std::pair<std::string, std::string>>{
           {" --job.name=dp --parallel.zero=2 ", "dp 2, ZeRO 2"},
           {" --job.name=tp --parallel.tp=2 ", "tp 2"},
           {" --job.name=pp --parallel.pp=2 ", "pp 2"}})
    expect_columns_near(one, train(common + flags, 2), {"loss", "grad_norm", "val_loss"}, 1e-4, what);
}

TEST_F(Cli, DistillationRefusesWhatCannotWork) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=teacher --training.steps=1")).code, 0);
  const std::string student = cat("train ", p("nano.toml"), " --job.name=s --training.teacher=", p("runs/teacher"));
  expect_bad_input(student + " --training.distill_alpha=1.5", {"training.distill_alpha", "= 1.5", "[0, 1]"});
  expect_bad_input(student + " --training.distill_temperature=0", {"training.distill_temperature", "= 0", "(0, 100]"});
  expect_bad_input(cat("train ", p("nano.toml"), " --job.name=s --training.teacher=", p("nowhere")), {p("nowhere")});
  expect_bad_input(student + " --model.vocab_size=300", {"training.teacher", "vocab_size is 256", "300"});
  expect_bad_input(student + " --model.seq_len=128", {"training.teacher", "seq_len", "128"});
  EXPECT_FALSE(std::filesystem::exists(p("runs/s")));
}

}  // namespace
}  // namespace loom
