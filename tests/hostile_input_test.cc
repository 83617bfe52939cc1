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
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "loom/core/fileio.h"
#include "loom/core/rng.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kBoundSeconds = 30;  // each run ends by itself well within this

// One malformed input: how to make it from a fresh copy, and the commands to run on it.
struct Variant {
  std::string kind, what;
  std::function<void(const std::string& root)> make;  // writes the variant under root
  bool must_fail = true;  // false: the change may leave the input valid (exit 0 allowed)
};

// Structural boundaries of a JSON text: after every {, }, [, ], :, ",".
std::vector<size_t> json_boundaries(const std::string& text) {
  std::vector<size_t> at;
  for (size_t i = 0; i < text.size(); ++i)
    if (std::string_view("{}[]:,\"").find(text[i]) != std::string_view::npos) at.push_back(i);
  return at;
}

// Every path to a value in a JSON document (objects' keys, arrays' first two elements).
void json_paths(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      out.push_back(at / it.key());
      json_paths(it.value(), at / it.key(), out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < std::min<size_t>(j.size(), 2); ++i) {
      out.push_back(at / i);
      json_paths(j[i], at / i, out);
    }
  }
}

json deep(int levels) {
  json j = 1;
  for (int i = 0; i < levels; ++i) j = json::array({j});
  return j;
}

// The values every field is replaced with: negative, zero, huge, fractional, non-numeric,
// wrong types, deep nesting.
std::vector<json> hostile_values() {
  return {-3, 0, 1.5, 1e300, json(INT64_MAX), json(UINT64_MAX), "10", "", nullptr, true, json::array(),
          json::object(), deep(40)};
}

class HostileInput : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    // A run to take checkpoints from: 2 steps of gpt-nano, checkpoint at step 2.
    const Result r = loom(cat("train ", p("nano.toml"), " --quiet --job.name=base --training.steps=2 --checkpoint.every=2"));
    ASSERT_EQ(r.code, 0) << r.err;
    step_dir_ = "checkpoints/step_2";
  }

  // Runs `args` (a loom command line) with the bound; checks what every run must hold and
  // whether it may pass. `names`: a fragment the error line must contain (the input's path).
  int check_run(const std::string& args, const std::string& names, bool must_fail, const std::string& what,
                const std::string& scratch) {
    const std::string err_path = scratch + ".err";
    const auto t0 = std::chrono::steady_clock::now();
    const testing::CommandResult c = testing::run_command(
        cat("timeout -s KILL ", kBoundSeconds, " ", LOOM_BINARY_DIR, "/loom ", args, " >/dev/null 2>", err_path));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string err;
    try {
      err = read_file(err_path);
    } catch (const Error&) {
    }
    fs::remove(err_path);
    const std::string ctx = cat(what, "\n  loom ", args, "\n  exit ", c.code, " after ", took, " s\n", err);
    std::lock_guard<std::mutex> lock(mu_);
    ++runs_;
    EXPECT_TRUE(c.code == 0 || c.code == 1 || c.code == 2) << "signal or hang: " << ctx;
    EXPECT_LT(took, kBoundSeconds) << ctx;
    EXPECT_EQ(err.find("internal error"), std::string::npos) << ctx;
    if (must_fail) {
      EXPECT_NE(c.code, 0) << "accepted: " << ctx;
    }
    if (c.code == 0) return 0;
    ++failures_;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << ctx;
    EXPECT_TRUE(err.starts_with("loom: error: ")) << ctx;
    // `names`: alternatives separated by '|' (a config's error names the file or the key).
    bool named = false;
    for (size_t at = 0; at <= names.size();) {
      const size_t bar = std::min(names.find('|', at), names.size());
      named = named || err.find(names.substr(at, bar - at)) != std::string::npos;
      at = bar + 1;
    }
    EXPECT_TRUE(named) << "the error does not name " << names << ": " << ctx;
    return c.code;
  }

  // Byte mutations of one file: truncations at `boundaries` (and empty), bit flips at
  // `flip_spots` positions drawn from [flip_lo, flip_hi), garbage appended, and the file
  // replaced by a directory, a FIFO, /dev/zero or a sparse 64 GiB file.
  std::vector<Variant> byte_variants(const std::string& kind, const std::string& rel, std::vector<size_t> boundaries,
                                     size_t flip_lo, size_t flip_hi, int flip_spots, bool flips_must_fail) {
    std::vector<Variant> out;
    const std::string original = read_file(p("runs/base/" + rel));
    boundaries.push_back(0);
    std::sort(boundaries.begin(), boundaries.end());
    boundaries.erase(std::unique(boundaries.begin(), boundaries.end()), boundaries.end());
    std::vector<size_t> spread;  // at most 24, evenly spread
    for (size_t i = 0; i < boundaries.size(); i += (boundaries.size() + 23) / 24) spread.push_back(boundaries[i]);
    for (size_t b : spread)
      if (b < original.size())
        out.push_back({kind, cat(rel, " truncated to ", b, " bytes"),
                       [=](const std::string& root) { write(root + "/" + rel, original.substr(0, b)); }});
    Rng rng(rel.size() * 7919 + original.size());
    for (int i = 0; i < flip_spots && flip_hi > flip_lo; ++i) {
      const size_t at = flip_lo + rng.below(std::min(flip_hi, original.size()) - flip_lo);
      const int bit = static_cast<int>(rng.below(8));
      out.push_back({kind, cat(rel, " bit ", bit, " of byte ", at, " flipped"),
                     [=](const std::string& root) {
                       std::string s = original;
                       s[at] = static_cast<char>(s[at] ^ (1 << bit));
                       write(root + "/" + rel, s);
                     },
                     flips_must_fail});
    }
    out.push_back({kind, rel + " with 4 KiB of garbage appended",
                   [=](const std::string& root) { write(root + "/" + rel, original + std::string(4096, '\x7f')); },
                   flips_must_fail});
    out.push_back({kind, rel + " a directory", [=](const std::string& root) {
                     fs::remove(root + "/" + rel);
                     fs::create_directory(root + "/" + rel);
                   }});
    out.push_back({kind, rel + " a FIFO", [=](const std::string& root) {
                     fs::remove(root + "/" + rel);
                     ASSERT_EQ(::mkfifo((root + "/" + rel).c_str(), 0600), 0);
                   }});
    out.push_back({kind, rel + " a link to /dev/zero", [=](const std::string& root) {
                     fs::remove(root + "/" + rel);
                     fs::create_symlink("/dev/zero", root + "/" + rel);
                   }});
    out.push_back({kind, rel + " sparse, 64 GiB", [=](const std::string& root) {
                     write(root + "/" + rel, original);
                     fs::resize_file(root + "/" + rel, uintmax_t{64} << 30);
                   }});
    return out;
  }

  // Field mutations of a JSON file: every path set to each hostile value, removed, a key
  // given twice, the whole document another type. With `rehash`, index.json's entry for
  // the file is updated so that the checkpoint's hash check passes and the field checks
  // are what refuse it.
  std::vector<Variant> json_variants(const std::string& kind, const std::string& rel, bool rehash) {
    std::vector<Variant> out;
    const std::string text = read_file(p("runs/base/" + rel));
    const json doc = json::parse(text);
    std::vector<json::json_pointer> paths;
    json_paths(doc, json::json_pointer(), paths);
    // index.json itself is rehashed (index.sha256) always: its field checks are what refuse.
    auto put = [=](const std::string& root, const std::string& body) {
      write(root + "/" + rel, body);
      if (rel.ends_with("index.json")) rehash_index((fs::path(root) / rel).parent_path());
      else if (rehash) refresh_index(root, rel);
    };
    // At most 30 paths, evenly spread; each gets 4 of the hostile values (the next path the
    // next 4) and removal.
    const std::vector<json> values = hostile_values();
    std::vector<json::json_pointer> spread;
    for (size_t i = 0; i < paths.size(); i += (paths.size() + 29) / 30) spread.push_back(paths[i]);
    for (size_t i = 0; i < spread.size(); ++i) {
      const json::json_pointer& path = spread[i];
      for (size_t k = 0; k < 4; ++k) {
        const json& v = values[(i * 4 + k) % values.size()];
        json d = doc;
        d[path] = v;
        out.push_back({kind, cat(rel, " ", path.to_string(), " = ", v.dump().substr(0, 40)),
                       [=](const std::string& root) { put(root, d.dump(2)); }, false});
      }
      json d = doc;
      if (!d[path.parent_pointer()].is_object()) continue;
      d[path.parent_pointer()].erase(path.back());
      out.push_back({kind, cat(rel, " ", path.to_string(), " removed"), [=](const std::string& root) { put(root, d.dump(2)); },
                     false});
    }
    out.push_back({kind, rel + " with a key given twice",
                   [=](const std::string& root) { put(root, "{\"format\": \"x\", " + text.substr(text.find('{') + 1)); }});
    for (const std::string& body : {std::string("[]"), std::string("7"), std::string("\"text\""), deep(200).dump()})
      out.push_back({kind, cat(rel, " replaced by ", body.substr(0, 20)), [=](const std::string& root) { put(root, body); }});
    return out;
  }

  // Points index.json's entry for `rel` (a file of the step directory) at its bytes now.
  static void refresh_index(const std::string& root, const std::string& rel) {
    const fs::path file = fs::path(root) / rel;
    const std::string index_path = (file.parent_path() / "index.json").string();
    json index = json::parse(read_file(index_path));
    const std::string bytes = read_file(file.string());
    index["files"][file.filename().string()] = {{"bytes", bytes.size()}, {"sha256", sha256_hex(bytes)}};
    write(index_path, index.dump(2));
    rehash_index(file.parent_path());
  }

  // Points index.sha256 at index.json's bytes now (what a tool that edits the index would do).
  static void rehash_index(const fs::path& step_dir) {
    write((step_dir / "index.sha256").string(), sha256_hex(read_file((step_dir / "index.json").string())) + "\n");
  }

  // The commands that read a checkpoint of run directory `run` (job name `job`).
  // `resume_only`: the commands that read the optimizer state.
  std::vector<std::string> checkpoint_commands(const std::string& run, const std::string& job,
                                               bool resume_only = false) const {
    std::vector<std::string> out = {cat("train ", p("nano.toml"), " --quiet --resume --job.name=", job)};
    if (resume_only) return out;
    out.push_back(cat("eval --checkpoint ", run, " --data ", p("val.bin")));
    out.push_back(cat("sample --checkpoint ", run, " --tokens 2"));
    return out;
  }

  // Each variant made in a fresh copy of runs/base (run directory runs/v<i>) and every
  // command run on it; two at a time. Every file that existed before must be unchanged
  // after: the copy, and everything else under the test directory.
  void run_all(const std::vector<Variant>& variants,
               const std::function<std::vector<std::string>(const std::string& run, const std::string& job)>& commands,
               const std::function<std::string(const std::string& run)>& names) {
    std::atomic<size_t> next{0};
    const std::string outside = snapshot(p("runs/base"));
    auto worker = [&] {
      for (size_t i; (i = next++) < variants.size();) {
        const Variant& v = variants[i];
        const std::string job = cat("v", i), run = p("runs/" + job);
        fs::copy(p("runs/base"), run, fs::copy_options::recursive);
        fs::remove(run + "/.lock");
        v.make(run);
        std::string before = snapshot(run);
        for (const std::string& cmd : commands(run, job)) {
          const int code = check_run(cmd, names(run), v.must_fail, cat(v.kind, ": ", v.what), run);
          const std::string after = snapshot(run);
          if (code != 0) {  // a refused input leaves every file as it was; an accepted one may train on
            std::lock_guard<std::mutex> lock(mu_);
            EXPECT_EQ(after, before) << v.what << ": loom " << cmd << " changed the input";
          }
          before = after;
        }
        fs::remove_all(run);
      }
    };
    std::thread a(worker), b(worker);
    a.join();
    b.join();
    EXPECT_EQ(snapshot(p("runs/base")), outside) << "a run changed the run it was copied from";
    std::printf("%s: %zu variants; %d runs so far, %d refused\n", variants.front().kind.c_str(), variants.size(), runs_,
                failures_);
    EXPECT_GE(variants.size(), 50u);
  }

  std::string step_dir_;
  std::mutex mu_;
  int runs_ = 0, failures_ = 0;
};

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
