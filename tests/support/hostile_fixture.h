// The hostile-input harness (tests/hostile_input_test.cc, tests/hostile_data_test.cc): variants
// of a file made from a fresh copy of a run, every command that reads it run on each within
// a bound, and what each run must hold checked (the test files' comments say what).
#pragma once

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
namespace hostile {
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
inline std::vector<size_t> json_boundaries(const std::string& text) {
  std::vector<size_t> at;
  for (size_t i = 0; i < text.size(); ++i)
    if (std::string_view("{}[]:,\"").find(text[i]) != std::string_view::npos) at.push_back(i);
  return at;
}

// Every path to a value in a JSON document (objects' keys, arrays' first two elements).
inline void json_paths(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
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

inline json deep(int levels) {
  json j = 1;
  for (int i = 0; i < levels; ++i) j = json::array({j});
  return j;
}

// The values every field is replaced with: negative, zero, huge, fractional, non-numeric,
// wrong types, deep nesting.
inline std::vector<json> hostile_values() {
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

}  // namespace hostile
}  // namespace loom
