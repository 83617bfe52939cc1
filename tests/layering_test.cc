// The library order, kept (issue 41, item 6; docs/architecture.md): every `#include "..."`
// of Loom's own headers in a library's sources (src/LIB/, tests aside) and public headers
// (include/loom/) names a header of that library or of one below it. The order is the
// CMake targets' (each src/LIB/CMakeLists.txt), as ../shared/DESIGN.md draws it:
//   core <- kernels <- nn, optim;  core <- data, obs, comm;  optim <- checkpoint;
//   nn, optim, comm, checkpoint <- parallel;  nn, checkpoint, data <- serve;  comm <- launch;  serve, comm <- bench;
//   parallel <- gpu;  gpu, serve, launch <- train
// A new public header must be placed in kHeaderLibrary, so that it is checked too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace loom {
namespace {

namespace fs = std::filesystem;

// Which library each public header belongs to.
const std::map<std::string, std::string> kHeaderLibrary = {
    {"loom/core/dtype.h", "core"},          {"loom/core/dtype_dispatch.h", "core"}, {"loom/core/error.h", "core"},
    {"loom/core/fileio.h", "core"}, {"loom/core/sha256.h", "core"},         {"loom/core/host.h", "core"},           {"loom/core/log.h", "core"},
    {"loom/core/params.h", "core"},         {"loom/core/rng.h", "core"},            {"loom/core/tensor.h", "core"},
    {"loom/core/threads.h", "core"},        {"loom/nn/gpt.h", "nn"}, {"loom/nn/gpt_config.h", "nn"}, {"loom/nn/kv_cache.h", "nn"}, {"loom/nn/model.h", "nn"},           {"loom/nn/layers.h", "nn"},
    {"loom/nn/mlp.h", "nn"},           {"loom/nn/shard.h", "nn"}, {"loom/nn/step_breakdown.h", "nn"},         {"loom/optim/optim.h", "optim"},
    {"loom/optim/loss_scale.h", "optim"},    {"loom/data/data.h", "data"}, {"loom/data/examples.h", "data"}, {"loom/data/tokenizer.h", "data"}, {"loom/data/dataset.h", "data"}, {"loom/data/prefetch.h", "data"}, {"loom/data/shard_cache.h", "data"},           {"loom/checkpoint/bounded_json.h", "checkpoint"},
    {"loom/checkpoint/checkpoint.h", "checkpoint"}, {"loom/checkpoint/json_fields.h", "checkpoint"}, {"loom/checkpoint/safetensors.h", "checkpoint"},
    {"loom/checkpoint/tensor_pieces.h", "checkpoint"}, {"loom/checkpoint/outputs.h", "checkpoint"}, {"loom/checkpoint/run_dir.h", "checkpoint"}, {"loom/obs/metrics.h", "obs"}, {"loom/obs/report.h", "obs"}, {"loom/obs/exporter.h", "obs"}, {"loom/obs/straggler.h", "obs"},    {"loom/obs/trace.h", "obs"},
    {"loom/comm/comm.h", "comm"},           {"loom/comm/rendezvous.h", "comm"},     {"loom/parallel/data_parallel.h", "parallel"},
    {"loom/parallel/param_server.h", "parallel"}, {"loom/parallel/ps_job.h", "parallel"}, {"loom/parallel/optimizer_step.h", "parallel"}, {"loom/parallel/pipeline.h", "parallel"}, {"loom/parallel/schedule.h", "parallel"},
    {"loom/parallel/tensor_parallel.h", "parallel"}, {"loom/parallel/comm_span.h", "parallel"}, {"loom/parallel/mesh.h", "parallel"}, {"loom/parallel/checkpointing.h", "parallel"},
    {"loom/parallel/memory_plan.h", "parallel"}, {"loom/parallel/parallelize.h", "parallel"}, {"loom/parallel/stage_costs.h", "parallel"}, {"loom/parallel/step_tracer.h", "parallel"}, {"loom/serve/batcher.h", "serve"},
    {"loom/serve/completion_request.h", "serve"}, {"loom/serve/http_server.h", "serve"},
    {"loom/serve/prefix_cache.h", "serve"}, {"loom/serve/gpt_loading.h", "serve"},
    {"loom/serve/model_cache.h", "serve"}, {"loom/serve/onnx.h", "serve"}, {"loom/serve/prune.h", "serve"}, {"loom/serve/sampler.h", "serve"}, {"loom/serve/completion_server.h", "serve"}, {"loom/serve/teacher.h", "serve"},
    {"loom/launch/launch.h", "launch"}, {"loom/bench/bench.h", "bench"}, {"loom/gpu/gpu.h", "gpu"}, {"loom/launch/rank_group.h", "launch"},
    {"loom/train/train.h", "train"}, {"loom/train/train_config.h", "train"}, {"loom/train/workload.h", "train"},
    {"loom/train/debug_hooks.h", "train"},
};

// What each library may include: itself and the libraries below it.
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"core", {"core"}},
    {"kernels", {"kernels", "core"}},
    {"nn", {"nn", "kernels", "core"}},
    {"optim", {"optim", "kernels", "core"}},
    {"data", {"data", "core"}},
    {"checkpoint", {"checkpoint", "optim", "kernels", "core"}},
    {"obs", {"obs", "core"}},
    {"comm", {"comm", "core"}},
    {"parallel", {"parallel", "comm", "checkpoint", "nn", "optim", "data", "obs", "kernels", "core"}},
    {"serve", {"serve", "nn", "checkpoint", "data", "optim", "kernels", "core"}},
    {"launch", {"launch", "comm", "core"}},
    {"bench", {"bench", "serve", "comm", "nn", "checkpoint", "data", "optim", "kernels", "core"}},
    {"gpu", {"gpu", "parallel", "comm", "checkpoint", "nn", "optim", "data", "obs", "kernels", "core"}},
    {"train", {"train", "gpu", "serve", "launch", "parallel", "comm", "checkpoint", "nn", "optim", "data", "obs", "kernels",
               "core"}},
};

// The library an include names: a public header's, or the first folder of a header inside
// src/ ("comm/net.h"); "" for a header of the same folder ("schema.h").
std::string library_of(const std::string& include) {
  if (include.starts_with("loom/")) {
    const auto found = kHeaderLibrary.find(include);
    return found == kHeaderLibrary.end() ? "?" : found->second;
  }
  const size_t slash = include.find('/');
  return slash == std::string::npos ? "" : include.substr(0, slash);
}

bool is_test_file(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.find("_test") != std::string::npos || name.find("testing") != std::string::npos;
}

// Each `#include "X"` in `file` whose library `lib` may not include: "file:line: X".
std::vector<std::string> violations(const fs::path& file, const std::string& lib) {
  static const std::regex include_line(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<std::string> out;
  std::ifstream in(file);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    std::smatch m;
    if (!std::regex_search(line, m, include_line)) continue;
    const std::string included = m[1], of = library_of(included);
    if (of.empty()) continue;
    if (of == "?") {
      out.push_back(file.string() + ":" + std::to_string(line_no) + ": " + included + " is in no library (kHeaderLibrary)");
    } else if (kMayInclude.contains(of) && !kMayInclude.at(lib).contains(of)) {
      out.push_back(file.string() + ":" + std::to_string(line_no) + ": " + lib + " includes " + included + " (" + of + ")");
    }
  }
  return out;
}

TEST(Layering, EveryLibraryIncludesOnlyItselfAndWhatIsBelowIt) {
  const fs::path root = LOOM_SOURCE_DIR;
  std::vector<std::string> found;
  int files = 0;
  for (const auto& [lib, allowed] : kMayInclude) {
    ASSERT_TRUE(fs::is_directory(root / "src" / lib)) << lib;
    for (const auto& e : fs::recursive_directory_iterator(root / "src" / lib)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h" && ext != ".cu") || is_test_file(e.path())) continue;
      ++files;
      for (std::string& v : violations(e.path(), lib)) found.push_back(std::move(v));
    }
  }
  for (const auto& e : fs::recursive_directory_iterator(root / "include" / "loom")) {
    if (!e.is_regular_file()) continue;
    const std::string name = fs::relative(e.path(), root / "include").string();
    const auto lib = kHeaderLibrary.find(name);
    if (lib == kHeaderLibrary.end()) {
      found.push_back(name + ": a public header in no library; add it to kHeaderLibrary");
      continue;
    }
    // include/loom mirrors src/: a library's public headers are in its own folder.
    if (!name.starts_with("loom/" + lib->second + "/"))
      found.push_back(name + ": a public header of " + lib->second + " outside include/loom/" + lib->second + "/");
    ++files;
    for (std::string& v : violations(e.path(), lib->second)) found.push_back(std::move(v));
  }
  EXPECT_GT(files, 100);
  for (const std::string& v : found) ADD_FAILURE() << v;
}

// Within parallel/: the pipeline executor and the tensor-parallel seam know nothing of data
// parallelism (what brackets a backward piece is the caller's callback), so that the step's
// owner can combine them with any data-parallel strategy.
TEST(Layering, PipelineAndTensorParallelDoNotIncludeDataParallel) {
  const fs::path root = LOOM_SOURCE_DIR;
  static const std::regex data_parallel(R"re(^\s*#\s*include\s*"loom/data_parallel\.h")re");
  for (const char* file : {"include/loom/parallel/pipeline.h", "src/parallel/pipeline.cc", "include/loom/parallel/tensor_parallel.h",
                           "src/parallel/tensor_parallel.cc"}) {
    std::ifstream in(root / file);
    ASSERT_TRUE(in) << file;
    for (std::string line; std::getline(in, line);) EXPECT_FALSE(std::regex_search(line, data_parallel)) << file << ": " << line;
  }
}

// Within comm/: the algorithms see the transport interface only, never a transport's
// insides (sockets, the shared window).
TEST(Layering, AlgorithmsSeeOnlyTheTransportInterface) {
  const fs::path dir = fs::path(LOOM_SOURCE_DIR) / "src/comm/algorithms";
  static const std::regex inside(R"re(^\s*#\s*include\s*"comm/transport/(shm|tcp|mpi)/)re");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path());
    ++files;
    for (std::string line; std::getline(in, line);)
      EXPECT_FALSE(std::regex_search(line, inside)) << e.path().filename().string() << ": " << line;
  }
  EXPECT_GE(files, 3);
}

// The checker itself: it sees a violation where there is one.
TEST(Layering, TheCheckFindsAnIncludeFromAbove) {
  const fs::path file = fs::temp_directory_path() / "loom_layering_probe.cc";
  std::ofstream(file) << "#include \"loom/core/tensor.h\"\n  #  include \"loom/nn/gpt.h\"\n#include \"schema.h\"\n";
  const std::vector<std::string> found = violations(file, "optim");
  fs::remove(file);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].find(":2: optim includes loom/nn/gpt.h (nn)"), std::string::npos) << found[0];
}

}  // namespace
}  // namespace loom
