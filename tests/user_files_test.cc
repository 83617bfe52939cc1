// Nothing a user owns is destroyed (issue 46): every writer refuses an output that is one of
// its inputs, lies in a run directory it does not own, or is not a regular file; a job's
// checkpoint.dir belongs to one run; counts from flags are bounded before anything is sized
// by them; names from a checkpoint reach the terminal escaped. Each refusal: exit 2, one
// line naming the path, and every file as it was.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

TEST_F(Cli, WritersRefuseOutputsTheyDoNotOwn) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  const std::string run = p("runs/r"), step = run + "/checkpoints/step_3";
  ASSERT_EQ(::mkfifo(p("fifo").c_str(), 0600), 0);
  fs::create_directories(p("w"));
  // ckpt export: over its own input, into the run, over a FIFO or a directory.
  expect_bad_input(cat("ckpt export ", run, " --out ", step, "/model-00000.safetensors"), {"lies inside the input", run});
  expect_bad_input(cat("ckpt export ", step, " --out ", run, "/w.safetensors"), {"lies in ", run, "run's directory"});
  expect_bad_input(cat("ckpt export ", run, " --out ", p("fifo")), {p("fifo"), "a FIFO", "left as it is"});
  expect_bad_input(cat("ckpt export ", run, " --out ", p("w")), {p("w"), "a directory"});
  expect_bad_input(cat("ckpt export ", run, " --format onnx --out ", p("fifo")), {p("fifo"), "a FIFO"});
  struct stat st{};
  ASSERT_EQ(::lstat(p("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  ASSERT_EQ(loom(cat("ckpt export ", run, " --out ", p("w.safetensors"))).code, 0);
  // prune and quantize write a checkpoint root: not into a run, not over a run's checkpoints.
  expect_bad_input(cat("prune --checkpoint ", run, " --sparsity 0.5 --out ", run, "/checkpoints"), {"the input", run});
  expect_bad_input(cat("prune --checkpoint ", p("w.safetensors"), " --model.n_head=2 --sparsity 0.5 --out ", run,
                       "/checkpoints"),
                   {"lies in ", run});
  expect_bad_input(cat("quantize --checkpoint ", p("w.safetensors"), " --model.n_head=2 --out ", run, "/pruned"),
                   {"lies in ", run});
  fs::copy(run + "/checkpoints", p("copied"), fs::copy_options::recursive);  // a training run's, without its lock
  expect_bad_input(cat("prune --checkpoint ", p("w.safetensors"), " --model.n_head=2 --sparsity 0.5 --out ", p("copied")),
                   {p("copied"), "training run's checkpoints", "step_3"});
  ASSERT_EQ(loom(cat("prune --checkpoint ", run, " --sparsity 0.5 --out ", p("pruned"))).code, 0);
  EXPECT_EQ(loom(cat("prune --checkpoint ", run, " --sparsity 0.25 --out ", p("pruned"))).code, 0);  // its own, again
  // data prepare: over its source, or a FIFO.
  write(p("t.txt"), "some text\n");
  expect_bad_input(cat("data prepare text:", p("t.txt"), " --out ", p("t.txt")), {p("t.txt"), "is the input"});
  expect_bad_input(cat("data prepare text:", p("t.txt"), " --out ", p("fifo")), {p("fifo"), "a FIFO"});
  expect_bad_input(cat("data prepare text:", p("t.txt"), " --out ", run, "/t.bin"), {"lies in ", run});
  // plan --svg over a FIFO.
  expect_bad_input(cat("plan --pp 2 --microbatches 4 --schedule 1f1b --svg ", p("fifo")), {p("fifo"), "a FIFO"});
}

// A job's checkpoint.dir: never inside another run's directory, never another run's
// directory, and once a run has written into one, no other run's job may.
TEST_F(Cli, CheckpointDirBelongsToOneRun) {
  const std::string train = cat("train ", p("nano.toml"), " --quiet --training.steps=3");
  ASSERT_EQ(loom(train).code, 0);
  expect_bad_input(cat(train, " --job.name=b --checkpoint.dir=", p("runs/r/checkpoints")),
                   {"checkpoint.dir", p("runs/r"), "another run's directory"});
  expect_bad_input(cat(train, " --job.name=b --checkpoint.dir=", p("runs/r")), {"checkpoint.dir", "another run's directory"});
  ASSERT_EQ(loom(cat(train, " --job.name=a --checkpoint.dir=", p("ck"))).code, 0);
  const Result r = loom(cat(train, " --job.name=c --checkpoint.dir=", p("ck")));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds the checkpoints of run " + p("runs/a")), std::string::npos) << r.err;
  EXPECT_EQ(read_file(p("ck/latest")), "step_3\n");
  // The run itself resumes from it.
  const Result resumed = loom(cat("train ", p("nano.toml"), " --quiet --training.steps=4 --job.name=a --resume --checkpoint.dir=",
                                  p("ck")));
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

// Counts from flags are bounded before anything is sized by them: each is refused at once
// with one line naming the flag (a 2147483647-stage plan grew to 6 GB before).
TEST_F(Cli, HugeZeroAndNegativeCountsAreRefusedNamingTheFlag) {
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"plan --pp 2147483647", "--pp = 2147483647: expected an integer in [1, 1024]"},
           {"plan --microbatches 2147483647", "--microbatches = 2147483647"},
           {"plan --width 2147483647", "--width = 2147483647"},
           {"plan --pp 0", "--pp = 0"},
           {"plan --virtual-stages -1", "--virtual-stages = -1"},
           {"plan --pp 1024 --microbatches 16384 --virtual-stages 2 --schedule interleaved", "forward passes to schedule"},
           {"plan --forward-ms inf", "--forward-ms = inf"},
           {"bench train --threads 0", "--threads = 0"},
           {"bench train --steps 0", "--steps = 0"},
           {"bench train --micro-batch -3", "--micro-batch = -3"},
           {"bench gemm --threads 100000", "--threads = 100000"},
           {"bench decode --steps 0", "--steps = 0"},
           {"bench decode --batch 0", "--batch = 0"},
           {"bench decode --threads 0", "--threads = 0"},
           {"bench comm --reps 0", "--reps = 0"},
           {"bench serve --port 1 --requests 0", "--requests = 0"},
       }) {
    const Result r = loom(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << "\n" << r.err;
  }
}

// Names from a checkpoint reach the output escaped (issue 46, item 6): a tensor name holding
// an OSC title sequence, a clear-screen, DEL and the C1 CSI (as UTF-8), in an index
// whose hash is consistent, passes `ckpt inspect` as text with no control byte in it.
TEST_F(Cli, CheckpointNamesAreEscapedOnOutput) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  const std::string dir = p("runs/r/checkpoints/step_3");
  nlohmann::json index = nlohmann::json::parse(read_file(dir + "/index.json"));
  // As JSON escapes: the name read back holds ESC, BEL, DEL and U+009B (C2 9B).
  const std::string hostile = R"(x\u001b]0;pwned\u0007\u001b[2J\u007f\u009by)";
  // Put in the file's text directly (JSON escapes would be read back as the same bytes).
  const std::string original = index["tensors"][0]["name"];
  std::string text = read_file(dir + "/index.json");
  const size_t at = text.find("\"" + original + "\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at + 1, original.size(), hostile);
  write(dir + "/index.json", text);
  write(dir + "/index.sha256", sha256_hex(text) + "\n");
  const Result r = loom(cat("ckpt inspect ", p("runs/r")));
  const std::string all = r.out + r.err;
  for (unsigned char c : all) {
    EXPECT_FALSE((c < 0x20 && c != '\n') || c == 0x7f || (c >= 0x80 && c < 0xa0)) << "raw byte " << int(c) << " in:\n" << all;
    if ((c < 0x20 && c != '\n') || c == 0x7f) break;
  }
  EXPECT_EQ(all.find("\xc2\x9b"), std::string::npos) << all;
  EXPECT_NE(all.find(R"(x\x1b]0;pwned\x07\x1b[2J\x7f\xc2\x9by)"), std::string::npos) << all;
}

}  // namespace
}  // namespace loom
