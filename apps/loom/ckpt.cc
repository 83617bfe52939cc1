// `loom ckpt verify | inspect | export` (docs/formats.md, "Checkpoint directories"): check
// every hash and the index, describe a checkpoint, and write its weights as one safetensors
// file with Hugging Face names, whatever layout wrote them.
#include <cstdio>
#include <filesystem>
#include <optional>

#include "commands.h"
#include "infer.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/error.h"
#include "loom/checkpoint/outputs.h"
#include "loom/core/log.h"
#include "loom/core/fileio.h"
#include "loom/data/tokenizer.h"

namespace loom::app {
namespace {

const char* part_name(checkpoint::Part p) { return p == checkpoint::Part::kModel ? "model" : "optimizer"; }

int verify(const checkpoint::Checkpoint& ck) {
  const int64_t bytes = ck.verify_all();
  const std::vector<checkpoint::TensorInfo> tensors = ck.tensors();
  if (const std::string bad = ck.nonfinite_report(); !bad.empty()) log_warn(bad);
  std::printf("%s: %zu files, %lld bytes, %zu tensors: every file's size and SHA-256 and every tensor's shards agree "
              "with index.json\n",
              printable(ck.path()).c_str(), ck.files().size(), static_cast<long long>(bytes), tensors.size());
  return 0;
}

int inspect(const checkpoint::Checkpoint& ck) {
  // Names and values come from the checkpoint's files: each is printed through printable(),
  // so a crafted name can neither add a line nor drive the terminal.
  std::printf("checkpoint %s (format version %d)\n", printable(ck.path()).c_str(), ck.format_version());
  if (ck.has_state()) {
    const checkpoint::State& s = ck.state();
    std::printf("step %lld, optimizer steps %lld, data cursor %s, finite %s\n", static_cast<long long>(s.step),
                static_cast<long long>(s.optimizer_steps), s.data_cursor ? std::to_string(*s.data_cursor).c_str() : "-",
                s.finite ? "yes" : "no");
    if (!s.model.is_null()) std::printf("model %s\n", printable(s.model.dump()).c_str());
  }
  if (!ck.layout().is_null()) std::printf("written by layout %s\n", printable(ck.layout().dump()).c_str());
  int64_t total = 0;
  for (const auto& [name, bytes] : ck.files()) {
    std::printf("file %s %lld bytes\n", printable(name).c_str(), static_cast<long long>(bytes));
    total += bytes;
  }
  int64_t elements[2] = {0, 0};
  for (const checkpoint::TensorInfo& t : ck.tensors()) {
    elements[static_cast<int>(t.part)] += shape_numel(t.shape);
    std::printf("tensor %s %s %s %s\n", part_name(t.part), printable(t.name).c_str(), std::string(safetensors_dtype_name(t.dtype)).c_str(),
                shape_str(t.shape).c_str());
  }
  std::printf("total %lld bytes; %lld model elements, %lld optimizer elements\n", static_cast<long long>(total),
              static_cast<long long>(elements[0]), static_cast<long long>(elements[1]));
  return 0;
}

int export_weights(const checkpoint::Checkpoint& ck, const std::string& out) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const checkpoint::TensorInfo& t : ck.tensors())
    if (t.part == checkpoint::Part::kModel)
      tensors.emplace_back(t.name, ck.read(t.name, t.dtype == DType::kF64 ? DType::kF64 : DType::kF32));
  if (tensors.empty()) throw InputError(cat(ck.path(), ": holds no weights to export"));
  if (const std::string bad = ck.nonfinite_report(); !bad.empty()) log_warn(bad);
  const WrittenFile w = write_safetensors(out, tensors, {{"format", "pt"}});
  std::printf("wrote %s: %zu tensors, %zu bytes\n", printable(out).c_str(), tensors.size(), w.bytes);
  return 0;
}

}  // namespace

int run_ckpt(const CkptArgs& a) {
  const std::string tokenizer_out = (std::filesystem::path(a.out).parent_path() / "tokenizer.json").string();
  if (a.action == "export") {
    checkpoint::check_output_file("--out", a.out, {a.path});
    checkpoint::check_output_file("--out (the tokenizer.json beside it)", tokenizer_out, {a.path});
  }
  const checkpoint::Checkpoint ck = checkpoint::Checkpoint::open(a.path);
  if (a.action == "verify") return verify(ck);
  if (a.action == "inspect") return inspect(ck);
  if (a.action == "export" && a.format != "safetensors" && a.format != "onnx")
    throw InputError(cat("loom ckpt export --format ", a.format, ": expected safetensors or onnx"));
  if (a.action == "export") {
    // The tokenizer, read and verified before anything is written.
    std::optional<data::Tokenizer> t;
    if (const auto enc = ck.extra_file("tokenizer/encoder.json"), bpe = ck.extra_file("tokenizer/vocab.bpe"); enc && bpe)
      t = data::Tokenizer::parse_gpt2_files(*enc, *bpe, ck.path() + "/tokenizer", "");
    const int rc = a.format == "onnx" ? export_onnx(ck, inference_config("", a.overrides).i("model.n_head"), a.out)
                                      : export_weights(ck, a.out);
    if (rc == 0 && t) {  // a run's tokenizer goes with its weights, as a Hugging Face tokenizer.json
      write_file_atomic(tokenizer_out, t->hf_json());
      std::printf("wrote %s: the run's tokenizer (vocabulary %lld)\n", printable(tokenizer_out).c_str(),
                  static_cast<long long>(t->vocab_size()));
    }
    return rc;
  }
  throw InputError(cat("loom ckpt ", a.action, ": expected verify, inspect or export"));
}

}  // namespace loom::app
