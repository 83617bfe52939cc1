#include "loom/train/workload.h"

#include <algorithm>
#include <filesystem>

#include "loom/data/data.h"
#include "loom/data/dataset.h"
#include "loom/data/shard_cache.h"
#include "loom/core/error.h"
#include "loom/nn/mlp.h"

namespace loom::train {

void check_vocab(const std::vector<uint16_t>& tokens, int64_t vocab, const std::string& path) {
  if (tokens.empty()) return;
  const uint16_t mx = *std::max_element(tokens.begin(), tokens.end());
  if (mx >= vocab)
    throw InputError(cat(path, ": token id ", mx, " is outside the model's vocabulary (model.vocab_size = ", vocab, ")"));
}

nlohmann::json Workload::model_json() const {
  const nn::ModelShape shape = model->shape();
  nlohmann::json j = {{"kind", shape.kind}};
  for (const auto& [name, value] : shape.fields) j[name] = value;
  return j;
}

namespace {

// A dataset's windows of t tokens: a manifest's shards, checked against it (their SHA-256
// too when `hash`), or one token file's, checked against the vocabulary; at least one window.
std::unique_ptr<data::Examples> windows(const std::string& path, int64_t vocab, int64_t t, bool hash,
                                        const TrainConfig::Data& d) {
  if (data::is_manifest(path)) {
    data::Manifest m = data::read_manifest(path);
    if (m.vocab_size > vocab)
      throw InputError(cat(path, ": vocab_size = ", m.vocab_size, " (its tokenizer's ids), but model.vocab_size = ", vocab,
                           ": expected at least ", m.vocab_size));
    const bool remote = data::check_local_shards(m, hash, d.document_windows);  // remote ones as they are fetched
    std::shared_ptr<data::ShardCache> cache;
    if (remote && d.cache_dir.empty())  // loom train's config resolves it; a TrainConfig built in C++ may not
      throw InputError(cat(path, ": its shards are remote and data.cache_dir is empty: expected the directory to cache "
                           "them in"));
    if (remote)
      cache = std::make_shared<data::ShardCache>(data::CacheOptions{
          .dir = d.cache_dir,
          .max_bytes = static_cast<int64_t>(d.cache_mb * 1024 * 1024), .retries = static_cast<int>(d.fetch_retries)});
    auto w = std::make_unique<data::ShardedWindows>(std::move(m), t, vocab, std::move(cache),
                                                    d.document_windows ? data::Windows::kDocuments : data::Windows::kTokens);
    if (w->size() < 1)
      throw InputError(cat(path, ": ", w->manifest().tokens, " tokens, no shard holds model.seq_len + 1 = ", t + 1));
    return w;
  }
  if (d.document_windows)
    throw InputError(cat(path, ": one token file has no document index; data.windows = \"documents\" reads a manifest's ",
                         "(loom data prepare --shard-tokens N writes one)"));
  std::vector<uint16_t> tokens = data::read_tokens(path);
  check_vocab(tokens, vocab, path);
  if (static_cast<int64_t>(tokens.size()) < t + 1)
    throw InputError(cat(path, ": ", tokens.size(), " tokens, need at least model.seq_len + 1 = ", t + 1));
  return std::make_unique<data::TokenWindows>(std::move(tokens), t);
}

Workload gpt_workload(const TrainConfig& t, const nn::GptPart& part, const nn::Shard& tp, bool init, bool lead) {
  const nn::GptConfig& cfg = t.model.gpt;
  Workload w;
  auto gpt = std::make_unique<nn::Gpt>(cfg, DType::kF32, part, tp);
  if (t.data.tokenizer != "bytes") {
    w.tokenizer = std::make_unique<data::Tokenizer>(data::Tokenizer::load(t.data.tokenizer));
    if (w.tokenizer->vocab_size() > cfg.vocab_size)
      throw InputError(cat("data.tokenizer = \"", printable(t.data.tokenizer), "\" has ", w.tokenizer->vocab_size(),
                           " ids, but model.vocab_size = ", cfg.vocab_size, ": expected at least ",
                           w.tokenizer->vocab_size()));
  }
  const bool hash = lead && t.data.hash_shards;
  w.train = windows(t.data.train, cfg.vocab_size, cfg.seq_len, hash, t.data);
  if (!t.data.val.empty()) w.val = windows(t.data.val, cfg.vocab_size, cfg.seq_len, hash, t.data);
  w.eval_batch = t.training.micro_batch;
  if (init) gpt->init(t.job.seed);
  gpt->set_recompute(t.training.recompute);
  gpt->set_precision(t.training.precision);
  // Only the processes that compute the loss (the last pipeline stage) need the teacher.
  if (!t.training.teacher.empty() && part.head)
    w.teacher = std::make_unique<serve::Teacher>(t.training.teacher, t.model.gpt, t.training.distill_alpha,
                                                 t.training.distill_temperature);
  w.model = std::move(gpt);
  return w;
}

// "fashion-mnist" or "fashion-mnist:DIR".
data::ImageSet load_images(const std::string& spec, bool train) {
  if (spec != "fashion-mnist" && !spec.starts_with("fashion-mnist:"))
    throw InputError(cat("data.train = \"", spec, "\": the mlp model reads \"fashion-mnist\" or \"fashion-mnist:DIR\""));
  std::string dir = spec == "fashion-mnist" ? data::kFashionMnistDir : spec.substr(14);
  return data::load_fashion_mnist(dir, train);
}

Workload mlp_workload(const TrainConfig& t, bool init) {
  data::ImageSet train = load_images(t.data.train, true);
  data::ImageSet test = load_images(t.data.val.empty() ? t.data.train : t.data.val, false);
  for (const auto* s : {&train, &test})
    for (int32_t l : s->labels)
      if (l >= t.model.classes)
        throw InputError(cat(t.data.train, ": label ", l, " but model.vocab_size (classes) = ", t.model.classes));
  if (test.rows * test.cols != train.rows * train.cols)
    throw InputError(cat(t.data.val, ": test images are ", test.rows, "x", test.cols, ", training images ", train.rows,
                         "x", train.cols));
  Workload w;
  auto mlp = std::make_unique<nn::MlpClassifier>(nn::MlpConfig{
      .inputs = train.rows * train.cols, .hidden = t.model.hidden, .n_hidden = t.model.n_hidden, .classes = t.model.classes});
  if (init) mlp->init(t.job.seed);
  w.model = std::move(mlp);
  w.train = std::make_unique<data::ImageExamples>(std::move(train));
  w.val = std::make_unique<data::ImageExamples>(std::move(test));
  w.eval_batch = std::max<int64_t>(t.training.micro_batch, 500);
  return w;
}

}  // namespace

Workload make_workload(const TrainConfig& t, const nn::GptPart& part, const nn::Shard& tp, bool init, bool lead) {
  if (t.model.kind == "mlp") return mlp_workload(t, init);
  return gpt_workload(t, part, tp, init, lead);
}

}  // namespace loom::train
