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
  // A job's checkpoints apart from the weights it starts from, which pruning would remove.
  const std::string before = snapshot(p("pruned"));
  expect_bad_input(cat("train ", p("nano.toml"), " --quiet --job.name=f --init-from ", p("pruned"), " --checkpoint.dir=",
                       p("pruned")),
                   {"--init-from", p("pruned"), "checkpoint.dir", "where this job writes"});
  expect_bad_input(cat("train ", p("nano.toml"), " --quiet --job.name=f --init-from ", p("pruned/step_0"),
                       " --checkpoint.dir=", p("pruned")),
                   {"--init-from", "lies inside", "checkpoint.dir"});
  EXPECT_EQ(snapshot(p("pruned")), before);
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --job.name=f --training.keep_zeros=true --init-from ", p("pruned"))).code, 0);
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
    EXPECT_LT(r.peak_rss, int64_t{96} << 20) << args << ": refused, but only after taking memory";
  }
}

// Every numeric flag of every subcommand takes a zero, a negative, a huge and a non-finite
// value (issue 46, item 7): each is refused at once with one line naming the flag (exit 2),
// or is a value the flag means (a count of 0 meaning none or all, say) and the command does
// its work. docs/security.md, "Limits", lists the bounds.
TEST_F(Cli, EveryNumericFlagTakesZeroNegativeHugeAndNonFiniteValues) {
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3")).code, 0);
  write(p("t.txt"), "some text to prepare\n");
  const std::string run = p("runs/r");
  struct Flag {
    std::string command, flag;
    bool integer;
    std::string accepted;  // which of z(ero), n(egative), h(uge), f (non-finite) the flag takes
  };
  const std::string sample = cat("sample --checkpoint ", run, " --prompt x"), serve = "serve --model a=" + p("nowhere");
  const std::string bench_train = "bench train --preset gpt-nano --steps 1 --warmup 0 --threads 1 --micro-batch 1";
  const std::string bench_decode = "bench decode --preset gpt-nano --steps 1 --warmup 0 --batch 1 --threads 1 --to 20";
  const std::string bench_comm = "bench comm --sizes 8 --reps 1 --warmup 0 --iters 1";
  const std::vector<Flag> flags = {
      {sample + " --lines 1 --top-k 4", "--tokens", true, "z"},
      {sample + " --tokens 2", "--lines", true, "z"},
      {sample + " --tokens 2", "--top-k", true, "z"},
      {sample + " --tokens 2", "--top-p", false, ""},
      {sample + " --tokens 2", "--temperature", false, ""},
      {sample + " --tokens 2", "--seed", true, "zh"},
      {cat("eval --checkpoint ", run, " --data ", p("val.bin")), "--batch", true, "h"},  // huge: every window in one
      {cat("prune --checkpoint ", run, " --out ", p("pruned")), "--sparsity", false, "z"},
      {cat("data prepare text:", p("t.txt"), " --out ", p("t.bin")), "--val-fraction", false, "z"},
      {"plan", "--pp", true, ""},
      {"plan", "--microbatches", true, ""},
      {"plan --schedule interleaved --pp 2 --microbatches 4", "--virtual-stages", true, ""},
      {"plan", "--width", true, ""},
      {"plan", "--forward-ms", false, "z"},
      {"plan", "--backward-ms", false, "z"},
      {"plan --schedule zb-h1", "--backward-input-ms", false, "z"},
      {"plan --schedule zb-h1", "--backward-weight-ms", false, "z"},
      {"plan", "--transfer-ms", false, "z"},
      {"plan", "--overhead-ms", false, "z"},
      {"plan", "--activation-mb", false, "z"},
      {bench_train + " --peak-gflops 100", "--threads", true, ""},
      {bench_train + " --peak-gflops 100", "--micro-batch", true, ""},
      {bench_train + " --peak-gflops 100", "--steps", true, ""},
      {bench_train + " --peak-gflops 100", "--warmup", true, "z"},
      {bench_train, "--peak-gflops", false, "z"},  // 0: measure it
      {"bench gemm", "--threads", true, ""},
      {bench_decode, "--batch", true, ""},
      {bench_decode, "--threads", true, ""},
      {bench_decode, "--from", true, ""},
      {"bench decode --preset gpt-nano --steps 1 --warmup 0 --batch 1 --threads 1", "--to", true, ""},
      {bench_decode, "--steps", true, ""},
      {bench_decode, "--warmup", true, "z"},
      {bench_decode, "--lanes", true, ""},
      {"bench serve --port 1", "--clients", true, ""},
      {"bench serve --port 1", "--requests", true, ""},
      {"bench serve --port 1", "--tokens", true, ""},
      {"bench serve --port 1", "--temperature", false, "z"},  // taken; then no server answers (exit 1)
      {"bench serve", "--port", true, ""},
      {bench_comm, "--reps", true, ""},
      {bench_comm, "--warmup", true, "z"},
      {bench_comm, "--iters", true, "z"},  // 0 calibrates
      {bench_comm, "--min-iters", true, ""},
      {bench_comm, "--factor", false, ""},
      {bench_comm, "--shm-slot", true, ""},
      {serve, "--port", true, "z"},  // taken ones end at the missing model (exit 2, naming it)
      {serve, "--max-tokens", true, ""},
      {serve, "--max-body-kb", true, ""},
      {serve, "--max-connections", true, ""},
      {serve, "--max-batch", true, ""},
      {serve, "--token-budget", true, ""},
      {serve, "--kv-cache-mb", true, ""},
      {serve, "--queue", true, "z"},
      {serve, "--events-nice", true, "z"},
      {serve, "--lanes", true, "z"},
      {serve, "--prefix-cache-mb", false, "z"},
      {serve, "--memory-mb", false, "z"},
      {"launch -n 1", "--nnodes", true, ""},
      {"launch -n 1", "--node-rank", true, "z"},
      {"launch -n 1", "--grace", false, ""},
      {"launch -n 1:2", "--max-restarts", true, "z"},
      {"launch -n 1:2", "--local", true, ""},
  };
  int refused = 0, taken = 0;
  int64_t peak = 0;  // the most memory a refusal took
  for (const Flag& f : flags)
    for (const char kind : std::string("znhf")) {
      const std::string value = kind == 'z' ? "0" : kind == 'n' ? "-1" : kind == 'f' ? "nan"
                                : f.integer ? "9223372036854775807" : "1e300";
      // The flag's value in the command, if any, gives way to the one tried.
      std::string command = f.command;
      if (const size_t at = command.find(" " + f.flag + " "); at != std::string::npos)
        command.erase(at, command.find(' ', at + f.flag.size() + 2) - at);
      const std::string args = cat(command, " ", f.flag, " ", value, f.command.starts_with("launch") ? " -- /bin/true" : "");
      std::filesystem::remove_all(p("pruned"));
      for (const char* file : {"t.bin", "t_val.bin"}) std::filesystem::remove(p(file));
      const Result r = loom(args);
      const bool accepted = f.accepted.find(kind) != std::string::npos;
      if (!accepted) {
        ++refused;
        EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
        EXPECT_NE(r.err.find(f.flag), std::string::npos) << args << "\n" << r.err;
        EXPECT_TRUE(r.err.starts_with("loom: error: ")) << args << "\n" << r.err;
        EXPECT_LT(r.peak_rss, int64_t{96} << 20) << args << ": refused, but only after taking memory";
        peak = std::max(peak, r.peak_rss);
        continue;
      }
      ++taken;
      if (f.command.starts_with("serve")) {
        EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
        EXPECT_NE(r.err.find("nowhere"), std::string::npos) << args << "\n" << r.err;
      } else if (f.command.starts_with("bench serve")) {
        EXPECT_NE(r.err.find("no loom serve answers"), std::string::npos) << args << "\n" << r.err;
      } else {
        EXPECT_EQ(r.code, 0) << args << "\n" << r.out << r.err;
      }
    }
  std::printf("%zu numeric flags: %d values refused (peak memory at most %.1f MiB), %d taken\n", flags.size(), refused,
              static_cast<double>(peak) / (1 << 20), taken);
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
  // No raw control byte (C0 but newline, DEL, C1 raw or as UTF-8) in what a command printed.
  auto expect_clean = [](const std::string& what, const Result& r) {
    const std::string all = r.out + r.err;
    for (unsigned char c : all)
      if ((c < 0x20 && c != '\n') || c == 0x7f || (c >= 0x80 && c < 0xa0)) {
        ADD_FAILURE() << what << ": raw byte " << int(c) << " in:\n" << all;
        break;
      }
    EXPECT_EQ(all.find("\xc2\x9b"), std::string::npos) << what << ": " << all;
    return all;
  };
  const std::string escaped = R"(x\x1b]0;pwned\x07\x1b[2J\x7f\xc2\x9by)";
  for (const char* command : {"ckpt inspect ", "ckpt verify "}) {
    const std::string all = expect_clean(command, loom(cat(command, p("runs/r"))));
    if (std::string(command) == "ckpt inspect ") {
      EXPECT_NE(all.find(escaped), std::string::npos) << all;
    }
  }
  // The model's loaders refuse the checkpoint (a tensor missing): eval, sample and serve.
  for (const std::string& command : {cat("eval --checkpoint ", dir, " --data ", p("val.bin")),
                                     cat("sample --checkpoint ", dir, " --tokens 2"),
                                     cat("serve --port 0 --model a=", dir)}) {
    const Result r = loom(command);
    EXPECT_EQ(r.code, 2) << command << "\n" << r.err;
    expect_clean(command, r);
  }
  // Names from flags: a model's name and a path, as a shell passes them (dash's printf).
  const std::string name = R"sh("$(printf 'x\033]0;pwned\007\033[2J\177\302\233y')")sh";
  expect_clean("serve --model", loom(cat("serve --port 0 --model ", name, "=", p("nowhere"))));
  expect_clean("plan --svg", loom(cat("plan --pp 2 --microbatches 2 --svg ", p("plan-"), name, ".svg")));
  const Result prepared = loom(cat("data prepare text:", p("nowhere-"), name, " --out ", p("t.bin")));
  EXPECT_EQ(prepared.code, 2);
  expect_clean("data prepare", prepared);
}

}  // namespace
}  // namespace loom
