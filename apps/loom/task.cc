#include "task.h"

#include <algorithm>

#include "loom/data.h"
#include "loom/error.h"
#include "loom/nn/mlp.h"
#include "teacher.h"

namespace loom::app {

nn::GptConfig gpt_config(const Config& c) {
  return {.n_layer = c.i("model.n_layer"), .n_head = c.i("model.n_head"),
          .d_model = c.i("model.d_model"), .seq_len = c.i("model.seq_len"),
          .vocab_size = c.i("model.vocab_size")};
}

void check_vocab(const std::vector<uint16_t>& tokens, int64_t vocab, const std::string& path) {
  if (tokens.empty()) return;
  const uint16_t mx = *std::max_element(tokens.begin(), tokens.end());
  if (mx >= vocab)
    throw InputError(cat(path, ": token id ", mx, " is outside the model's vocabulary (model.vocab_size = ", vocab, ")"));
}

namespace {

// Fills (B, T) inputs and targets from windows: window w is tokens[wT, wT + T) -> +1.
void fill_windows(const std::vector<uint16_t>& tokens, const std::vector<int64_t>& windows,
                  int64_t t, const Tensor& x, const Tensor& y) {
  int32_t* xd = x.data<int32_t>();
  int32_t* yd = y.data<int32_t>();
  for (size_t b = 0; b < windows.size(); ++b) {
    const uint16_t* src = tokens.data() + windows[b] * t;
    for (int64_t i = 0; i < t; ++i) {
      xd[b * t + i] = src[i];
      yd[b * t + i] = src[i + 1];
    }
  }
}

class GptTask : public Task {
 public:
  GptTask(const Config& c, const nn::GptPart& part, const nn::Shard& tp, bool init)
      : cfg_(gpt_config(c)), gpt_(cfg_, DType::kF32, part, tp), tp_(tp), t_(cfg_.seq_len) {
    train_ = data::read_tokens(c.s("data.train"));
    check_vocab(train_, cfg_.vocab_size, c.s("data.train"));
    if (static_cast<int64_t>(train_.size()) < t_ + 1)
      throw InputError(cat(c.s("data.train"), ": ", train_.size(), " tokens, need at least model.seq_len + 1 = ", t_ + 1));
    if (!c.s("data.val").empty()) {
      val_ = data::read_tokens(c.s("data.val"));
      check_vocab(val_, cfg_.vocab_size, c.s("data.val"));
      if (static_cast<int64_t>(val_.size()) < t_ + 1)
        throw InputError(cat(c.s("data.val"), ": ", val_.size(), " tokens, need at least model.seq_len + 1 = ", t_ + 1));
    }
    micro_batch_ = c.i("training.micro_batch");
    if (init) gpt_.init(static_cast<uint64_t>(c.i("job.seed")));
    gpt_.set_recompute(nn::recompute_named(c.s("training.recompute")));
    gpt_.set_precision(precision_format(c.s("training.precision")));
    // Only the processes that compute the loss (the last pipeline stage) need the teacher.
    if (!c.s("training.teacher").empty() && part.head) teacher_ = std::make_unique<Teacher>(c, cfg_);
  }

  ParamSet& params() override { return gpt_.params(); }
  int64_t train_items() const override { return (static_cast<int64_t>(train_.size()) - 1) / t_; }
  bool has_validation() const override { return !val_.empty(); }
  int64_t tokens_per_item() const override { return t_; }
  double train_flops_per_item() const override { return 3.0 * gpt_.forward_flops_per_token(t_) * t_; }
  nlohmann::json model_json() const override {
    return {{"kind", "gpt"}, {"n_layer", cfg_.n_layer}, {"n_head", cfg_.n_head}, {"d_model", cfg_.d_model},
            {"seq_len", cfg_.seq_len}, {"vocab_size", cfg_.vocab_size}};
  }

  void set_block_hook(BlockHook hook) override { gpt_.on_block = std::move(hook); }
  std::vector<int64_t> block_offsets() const override { return gpt_.block_offsets(); }

  nn::Gpt* gpt() override { return &gpt_; }
  std::pair<Tensor, Tensor> batch(const std::vector<int64_t>& items) override {
    const auto b = static_cast<int64_t>(items.size());
    Tensor x = Tensor::zeros({b, t_}, DType::kI32), y = Tensor::zeros({b, t_}, DType::kI32);
    fill_windows(train_, items, t_, x, y);
    return {x, y};
  }

  bool distilling() const override { return teacher_ != nullptr; }
  void set_distill_targets(const Tensor& tokens, nn::CrossEntropyCtx& loss) override {
    loss.distill = teacher_->targets(tokens, tp_);
  }

  double micro_step(const std::vector<int64_t>& items, double scale) override {
    auto [x, y] = batch(items);
    if (teacher_) ctx_.loss.distill = teacher_->targets(x, tp_, ctx_.loss.distill.soft);
    double loss = gpt_.forward(x, y, ctx_);
    gpt_.backward(ctx_, scale);
    return loss;
  }

  EvalResult evaluate(int64_t max_items, const nn::Gpt* whole) override {
    return eval_windows(whole ? *whole : gpt_, val_, t_, micro_batch_, max_items);
  }

 private:
  nn::GptConfig cfg_;
  nn::Gpt gpt_;
  nn::Shard tp_;
  std::unique_ptr<Teacher> teacher_;
  int64_t t_;
  int64_t micro_batch_ = 1;
  std::vector<uint16_t> train_, val_;
  nn::GptCtx ctx_;
};

// "fashion-mnist" or "fashion-mnist:DIR".
data::ImageSet load_images(const std::string& spec, bool train) {
  if (spec != "fashion-mnist" && !spec.starts_with("fashion-mnist:"))
    throw InputError(cat("data.train = \"", spec, "\": the mlp model reads \"fashion-mnist\" or \"fashion-mnist:DIR\""));
  std::string dir = spec == "fashion-mnist" ? data::kFashionMnistDir : spec.substr(14);
  return data::load_fashion_mnist(dir, train);
}

class MlpTask : public Task {
 public:
  MlpTask(const Config& c, bool init)
      : train_(load_images(c.s("data.train"), true)),
        test_(load_images(c.s("data.val").empty() ? c.s("data.train") : c.s("data.val"), false)),
        mlp_({.inputs = train_.rows * train_.cols, .hidden = c.i("model.hidden"),
              .n_hidden = c.i("model.n_layer"), .classes = c.i("model.vocab_size")}) {
    for (const auto* s : {&train_, &test_})
      for (int32_t l : s->labels)
        if (l >= c.i("model.vocab_size"))
          throw InputError(cat(c.s("data.train"), ": label ", l, " but model.vocab_size (classes) = ", c.i("model.vocab_size")));
    if (test_.rows * test_.cols != train_.rows * train_.cols)
      throw InputError(cat(c.s("data.val"), ": test images are ", test_.rows, "x", test_.cols, ", training images ",
                           train_.rows, "x", train_.cols));
    eval_batch_ = std::max<int64_t>(c.i("training.micro_batch"), 500);
    if (init) mlp_.init(static_cast<uint64_t>(c.i("job.seed")));
  }

  ParamSet& params() override { return mlp_.params(); }
  int64_t train_items() const override { return train_.n; }
  bool has_validation() const override { return true; }
  int64_t tokens_per_item() const override { return 1; }
  double train_flops_per_item() const override { return 6.0 * static_cast<double>(mlp_.params().numel()); }
  nlohmann::json model_json() const override {
    return {{"kind", "mlp"}, {"inputs", mlp_.config().inputs}, {"hidden", mlp_.config().hidden},
            {"n_hidden", mlp_.config().n_hidden}, {"classes", mlp_.config().classes}};
  }

  void set_block_hook(BlockHook hook) override { mlp_.on_block = std::move(hook); }
  std::vector<int64_t> block_offsets() const override { return mlp_.block_offsets(); }

  double micro_step(const std::vector<int64_t>& items, double scale) override {
    auto [x, y] = gather(train_, items);
    double loss = mlp_.forward(x, y, ctx_);
    mlp_.backward(ctx_, scale);
    return loss;
  }

  std::pair<Tensor, Tensor> batch(const std::vector<int64_t>& items) override { return gather(train_, items); }

  EvalResult evaluate(int64_t max_items, const nn::Gpt*) override {
    const int64_t n = max_items > 0 ? std::min(max_items, test_.n) : test_.n;
    EvalResult r{.accuracy = 0};
    double loss_sum = 0;
    int64_t correct = 0;
    for (int64_t start = 0; start < n; start += eval_batch_) {
      std::vector<int64_t> items;
      for (int64_t i = start; i < std::min(n, start + eval_batch_); ++i) items.push_back(i);
      auto [x, y] = gather(test_, items);
      loss_sum += mlp_.forward(x, y, ctx_) * static_cast<double>(items.size());
      const float* logits = ctx_.logits.data<float>();
      const int64_t k = mlp_.config().classes;
      for (size_t i = 0; i < items.size(); ++i) {
        const float* row = logits + static_cast<int64_t>(i) * k;
        if (std::max_element(row, row + k) - row == y.data<int32_t>()[i]) ++correct;
      }
    }
    r.items = n;
    r.loss = loss_sum / static_cast<double>(n);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
    return r;
  }

 private:
  static std::pair<Tensor, Tensor> gather(const data::ImageSet& s, const std::vector<int64_t>& items) {
    const int64_t d = s.rows * s.cols, b = static_cast<int64_t>(items.size());
    Tensor x = Tensor::zeros({b, d}, DType::kF32), y = Tensor::zeros({b}, DType::kI32);
    for (int64_t i = 0; i < b; ++i) {
      std::copy_n(s.pixels.data() + items[i] * d, d, x.data<float>() + i * d);
      y.data<int32_t>()[i] = s.labels[items[i]];
    }
    return {x, y};
  }

  data::ImageSet train_, test_;
  nn::MlpClassifier mlp_;
  nn::MlpClassifierCtx ctx_;
  int64_t eval_batch_ = 500;
};

}  // namespace

EvalResult eval_windows(const nn::Gpt& gpt, const std::vector<uint16_t>& tokens, int64_t t,
                        int64_t batch, int64_t max_windows) {
  EvalResult r;
  int64_t windows = (static_cast<int64_t>(tokens.size()) - 1) / t;
  if (max_windows > 0) windows = std::min(windows, max_windows);
  nn::GptCtx ctx;
  double sum = 0;
  for (int64_t start = 0; start < windows; start += batch) {
    std::vector<int64_t> ws;
    for (int64_t w = start; w < std::min(windows, start + batch); ++w) ws.push_back(w);
    const auto b = static_cast<int64_t>(ws.size());
    Tensor x = Tensor::zeros({b, t}, DType::kI32), y = Tensor::zeros({b, t}, DType::kI32);
    fill_windows(tokens, ws, t, x, y);
    sum += gpt.forward(x, y, ctx) * static_cast<double>(b);
  }
  r.items = windows * t;
  r.loss = windows == 0 ? 0.0 : sum / static_cast<double>(windows);
  return r;
}

std::unique_ptr<Task> make_task(const Config& c, const nn::GptPart& part, const nn::Shard& tp, bool init) {
  if (model_kind(c) == "mlp") return std::make_unique<MlpTask>(c, init);
  return std::make_unique<GptTask>(c, part, tp, init);
}

}  // namespace loom::app
