// Hostile input (issue 17, docs/errors.md): a generator writes hundreds of malformed
// variants of every file kind Loom reads (checkpoint state.json, index.json, model and
// optimizer safetensors, latest, bare safetensors, token files, TOML configs, IDX images,
// text sources): truncations at structural boundaries, bit flips, wrong, huge, negative,
// zero and non-numeric fields, wrong types, duplicate and missing keys, deep nesting,
// and files that are directories, FIFOs, /dev/zero or sparse and huge. Every CLI entry
// point that reads the kind runs on each, and must: end by itself within a bound, by no
// signal, with exit 0 (a variant that is still valid) or 1 or 2 and then exactly one line
// "loom: error: ..." naming a file of the input; never report an internal error; and leave
// every file that existed before byte for byte as it was.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "hostile_fixture.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using hostile::HostileInput;
using hostile::Variant;
using hostile::json_boundaries;
using hostile::json_paths;
using hostile::hostile_values;
using hostile::deep;
using hostile::kBoundSeconds;

// Boundaries of a safetensors file: the length field, the header's JSON structure, and
// every tensor's first and last byte.
std::vector<size_t> safetensors_boundaries(const std::string& bytes) {
  std::vector<size_t> at = {1, 4, 7, 8, 9};
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header = bytes.substr(8, n);
  const std::vector<size_t> inner = json_boundaries(header);
  for (size_t i = 0; i < inner.size(); i += std::max<size_t>(1, inner.size() / 24)) at.push_back(8 + inner[i]);
  at.push_back(8 + n - 1);
  at.push_back(8 + n);
  const json parsed = json::parse(header);
  for (auto it = parsed.begin(); it != parsed.end(); ++it)
    if (it.value().contains("data_offsets")) {
      at.push_back(8 + n + it.value()["data_offsets"][0].get<size_t>() + 1);
      at.push_back(8 + n + it.value()["data_offsets"][1].get<size_t>() - 1);
    }
  return at;
}

TEST_F(HostileInput, CheckpointStateAndIndex) {
  std::vector<Variant> all = json_variants("state.json", step_dir_ + "/state.json", /*rehash=*/true);
  for (Variant& v : json_variants("index.json", step_dir_ + "/index.json", /*rehash=*/false)) all.push_back(std::move(v));
  for (const char* f : {"state.json", "index.json"}) {
    const std::string rel = step_dir_ + "/" + f, text = read_file(p("runs/base/" + rel));
    for (Variant& v : byte_variants(f, rel, json_boundaries(text), 0, text.size(), 20, /*flips_must_fail=*/f == std::string("state.json")))
      all.push_back(std::move(v));
  }
  run_all(all, [&](const std::string& run, const std::string& job) { return checkpoint_commands(run, job); },
          [](const std::string& run) { return run; });
}

// Shard files are read when a load needs them: `eval` and `sample` read the model's,
// `--resume` both. So the optimizer file's variants run `--resume` alone, the others every
// command.
TEST_F(HostileInput, CheckpointTensorsAndLatest) {
  std::vector<Variant> all, optimizer;
  for (const char* f : {"model-00000.safetensors", "optimizer-00000.safetensors"}) {
    if (f == std::string("optimizer-00000.safetensors")) std::swap(all, optimizer);
    const std::string rel = step_dir_ + "/" + f, bytes = read_file(p("runs/base/" + rel));
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    // Unrehashed: the hash check refuses each. Rehashed: the parser and the index check do.
    for (Variant& v : byte_variants(f, rel, safetensors_boundaries(bytes), 0, 8 + n, 12, true)) all.push_back(std::move(v));
    for (Variant v : byte_variants(f, rel, safetensors_boundaries(bytes), 0, 8 + n, 12, false)) {
      auto make = v.make;
      v.what += " (index.json updated)";
      v.make = [=](const std::string& root) {
        make(root);
        if (fs::is_regular_file(root + "/" + rel) && fs::file_size(root + "/" + rel) < (uintmax_t{1} << 30))
          refresh_index(root, rel);
      };
      all.push_back(std::move(v));
    }
    // Header fields with hostile values, the file rewritten and rehashed.
    const json header = json::parse(bytes.substr(8, n));
    const std::string data = bytes.substr(8 + n);
    std::vector<json::json_pointer> paths;
    json_paths(header, json::json_pointer(), paths);
    const std::vector<json> values = hostile_values();
    for (size_t i = 0; i < paths.size(); i += (paths.size() + 19) / 20)
      for (const json& v : {values[i % values.size()], values[(i + 1) % values.size()], values[(i + 2) % values.size()]}) {
        json h = header;
        h[paths[i]] = v;
        std::string text = h.dump();
        std::string out(8, '\0');
        const uint64_t len = text.size();
        std::memcpy(out.data(), &len, 8);
        out += text + data;
        all.push_back({f, cat(rel, " header ", paths[i].to_string(), " = ", v.dump().substr(0, 30), " (rehashed)"),
                       [=](const std::string& root) {
                         write(root + "/" + rel, out);
                         refresh_index(root, rel);
                       },
                       false});
      }
  }
  std::swap(all, optimizer);
  run_all(optimizer, [&](const std::string& run, const std::string& job) { return checkpoint_commands(run, job, true); },
          [](const std::string& run) { return run; });
  for (const char* name : {"", "step_3", "step_-1", "../base", "step_2/..", "step_99999999999999999999", "\x01\x02",
                           "step_2\nstep_3"})
    all.push_back({"latest", cat("latest = \"", printable(name), "\""), [=](const std::string& root) {
                     write(root + "/checkpoints/latest", name);
                   }});
  for (Variant& v : byte_variants("latest", "checkpoints/latest", {3, 5}, 0, 7, 10, false)) all.push_back(std::move(v));
  run_all(all, [&](const std::string& run, const std::string& job) { return checkpoint_commands(run, job); },
          [](const std::string& run) { return run; });
}

TEST_F(HostileInput, BareSafetensorsTokenFilesConfigsAndImages) {
  // Inputs outside a run directory live in the copy too, so every variant is its own.
  fs::copy_file(p("runs/base/" + step_dir_ + "/model-00000.safetensors"), p("runs/base/bare.safetensors"));
  fs::copy_file(p("val.bin"), p("runs/base/tokens.bin"));
  write(p("runs/base/run.toml"), read_file(p("nano.toml")) + "\n[profile]\ntrace_steps = \"\"\n");
  // Images: a small Fashion-MNIST-shaped IDX set (gzip), 12 training and 6 test images.
  fs::create_directories(p("runs/base/images"));
  auto idx = [&](const std::string& name, std::vector<uint32_t> dims) {
    std::string b;
    auto be32 = [&](uint32_t v) {
      for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((v >> s) & 0xff));
    };
    be32(0x0800u | static_cast<uint32_t>(dims.size()));
    size_t total = 1;
    for (uint32_t d : dims) {
      be32(d);
      total *= d;
    }
    for (size_t i = 0; i < total; ++i) b.push_back(static_cast<char>(dims.size() == 1 ? i % 10 : i % 251));
    // Compressed here with zlib (the library Loom reads it with), not a gzip program.
    gzFile gz = ::gzopen(p("runs/base/images/" + name + ".gz").c_str(), "wb");
    ASSERT_NE(gz, nullptr);
    ASSERT_EQ(::gzwrite(gz, b.data(), static_cast<unsigned>(b.size())), static_cast<int>(b.size()));
    ASSERT_EQ(::gzclose(gz), Z_OK);
  };
  idx("train-images-idx3-ubyte", {12, 28, 28});
  idx("train-labels-idx1-ubyte", {12});
  idx("t10k-images-idx3-ubyte", {6, 28, 28});
  idx("t10k-labels-idx1-ubyte", {6});

  std::vector<Variant> bare, tokens, configs, images;
  {
    const std::string bytes = read_file(p("runs/base/bare.safetensors"));
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    bare = byte_variants("bare safetensors", "bare.safetensors", safetensors_boundaries(bytes), 0, 8 + n, 60, false);
  }
  tokens = byte_variants("token file", "tokens.bin", {1, 4, 11, 12, 1023, 1024, 1025, 2000}, 0, 12, 40, false);
  for (int64_t count : {-1, 0, 1, 1000000, INT32_MAX})
    tokens.push_back({"token file", cat("tokens.bin count = ", count), [=](const std::string& root) {
                        std::string s = read_file(root + "/tokens.bin");
                        const auto c = static_cast<int32_t>(count);
                        std::memcpy(s.data() + 8, &c, 4);
                        write(root + "/tokens.bin", s);
                      }});
  {
    const std::string text = read_file(p("runs/base/run.toml"));
    std::vector<size_t> lines;
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n' || text[i] == '=' || text[i] == '"' || text[i] == '[') lines.push_back(i);
    configs = byte_variants("config", "run.toml", lines, 0, text.size(), 40, false);
    for (Variant& v : configs)  // a TOML cut at a line, or with a flipped bit, may still be valid
      v.must_fail = v.what.find("truncated") == std::string::npos && v.what.find("flipped") == std::string::npos;
    for (const char* key : {"steps", "global_batch", "micro_batch", "lr", "warmup_steps", "eval_every", "eval_steps"})
      for (const char* value : {"-1", "0", "1e999", "nan", "inf", "9223372036854775807", "\"x\"", "true", "[1]", "{a = 1}",
                                "99999999999999999999999"})
        configs.push_back({"config", cat("[training] ", key, " = ", value), [=](const std::string& root) {
                             write(root + "/run.toml", text + "\n[training]\n" + key + " = " + value + "\n");
                           }, false});
    for (const char* extra : {"[model]\nd_model = 4611686018427387904\n", "[model]\nd_model = 0\n", "[model]\nn_head = 3\n",
                              "[model]\nseq_len = 2147483647\n", "[model]\nvocab_size = 65537\n", "[job]\nname = \"../x\"\n",
                              "[data]\ntrain = \"/dev/zero\"\n", "[data]\ntrain = \"/\"\n", "[nope]\nx = 1\n",
                              "[parallel]\ndp = 1048577\n", "[parallel]\npp = 2\n", "a = [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]\n"})
      configs.push_back({"config", cat("added ", printable(extra)), [=](const std::string& root) {
                           write(root + "/run.toml", text + "\n" + extra);
                         }, false});
  }
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"}) {
    const std::string raw = read_file(p(std::string("runs/base/images/") + f));
    for (Variant& v : byte_variants("IDX", std::string("images/") + f, {2, 10, 20, raw.size() / 2, raw.size() - 4}, 0,
                                    raw.size(), 15, false))
      images.push_back(std::move(v));
  }
  run_all(bare,
          [&](const std::string& run, const std::string&) {
            return std::vector<std::string>{
                cat("eval --checkpoint ", run, "/bare.safetensors --data ", p("val.bin"), " --model.n_head=2"),
                cat("sample --checkpoint ", run, "/bare.safetensors --tokens 2 --model.n_head=2")};
          },
          [](const std::string& run) { return run + "/bare.safetensors"; });
  run_all(tokens,
          [&](const std::string& run, const std::string& job) {
            return std::vector<std::string>{
                cat("train ", p("nano.toml"), " --quiet --training.steps=1 --job.name=t", job, " --data.train=", run,
                    "/tokens.bin"),
                cat("eval --checkpoint ", p("runs/base"), " --data ", run, "/tokens.bin")};
          },
          [](const std::string& run) { return run + "/tokens.bin"; });
  run_all(configs,
          [&](const std::string& run, const std::string&) {
            return std::vector<std::string>{cat("train ", run, "/run.toml --dry-run"),
                                            cat("train ", run, "/run.toml --quiet --training.steps=1 --job.run_dir=", run)};
          },
          [](const std::string& run) {
            return run + "|job.|model.|data.|training.|parallel.|comm.|checkpoint.|profile.|.bin: cannot open";
          });
  run_all(images,
          [&](const std::string& run, const std::string&) {
            return std::vector<std::string>{cat("train ", LOOM_SOURCE_DIR, "/configs/mlp.toml --quiet --training.steps=1 "
                                                "--model.hidden=8 --training.global_batch=4 --training.micro_batch=4 "
                                                "--job.threads=1 --job.run_dir=",
                                                run, " --data.train=fashion-mnist:", run, "/images --data.val=fashion-mnist:",
                                                run, "/images")};
          },
          [](const std::string& run) { return run + "/images"; });
  // Text sources for data prepare: a FIFO, /dev/zero, a directory of them.
  fs::create_directories(p("src"));
  ASSERT_EQ(::mkfifo(p("src/fifo").c_str(), 0600), 0);
  for (const std::string& src : {p("src/fifo"), std::string("/dev/zero"), p("missing")})
    check_run(cat("data prepare text:", src, " --out ", p("out/x.bin")), src, true, "data prepare " + src, p("prep"));
  check_run(cat("data prepare text:", p("src"), " --out ", p("out/x.bin")), "", true, "a directory of no text", p("prep"));
}

}  // namespace
}  // namespace loom
