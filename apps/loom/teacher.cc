#include "teacher.h"

#include <algorithm>
#include <cmath>

#include "infer.h"
#include "loom/checkpoint.h"
#include "loom/error.h"
#include "loom/log.h"

namespace loom::app {

Teacher::Teacher(const Config& c, const nn::GptConfig& student)
    : alpha_(c.f("training.distill_alpha")), temperature_(c.f("training.distill_temperature")) {
  const std::string path = c.s("training.teacher");
  gpt_ = load_gpt(checkpoint::Checkpoint::open(path), c);
  const nn::GptConfig& t = gpt_->config();
  if (t.vocab_size != student.vocab_size)
    throw InputError(cat("training.teacher = ", path, ": its vocab_size is ", t.vocab_size, ", the student's (model.vocab_size) ",
                         student.vocab_size, "; expected the same vocabulary"));
  if (t.seq_len < student.seq_len)
    throw InputError(cat("training.teacher = ", path, ": its window (seq_len) is ", t.seq_len, ", shorter than the student's ",
                         "model.seq_len = ", student.seq_len));
  log_info(cat("distilling from ", path, " (n_layer ", t.n_layer, ", d_model ", t.d_model, ", ", gpt_->int8() ? "int8" : "f32",
               " weights): alpha ", alpha_, ", temperature ", temperature_));
}

Teacher::~Teacher() = default;

nn::DistillTargets Teacher::targets(const Tensor& tokens, const nn::Shard& vocab, const Tensor& reuse) {
  const int64_t n = tokens.numel(), v_all = gpt_->config().vocab_size, v = v_all / vocab.parts, begin = vocab.index * v;
  const Tensor logits = gpt_->forward_logits(tokens, ctx_, /*last_only=*/false);  // (B, T, V)
  Tensor soft = reuse.defined() && reuse.numel() == n * v ? reuse : Tensor::zeros({n, v}, DType::kF32);
  const float* z = logits.data<float>();
  float* p = soft.data<float>();
  const double inv_t = 1.0 / temperature_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = z + i * v_all;
    const double mx = *std::max_element(row, row + v_all);
    double sum = 0;
    for (int64_t j = 0; j < v_all; ++j) sum += std::exp((row[j] - mx) * inv_t);
    for (int64_t j = 0; j < v; ++j) p[i * v + j] = static_cast<float>(std::exp((row[begin + j] - mx) * inv_t) / sum);
  }
  return {.soft = soft, .alpha = alpha_, .temperature = temperature_};
}

}  // namespace loom::app
