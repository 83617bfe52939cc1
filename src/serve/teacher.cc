#include "loom/serve/teacher.h"

#include <algorithm>
#include <cmath>

#include "loom/serve/gpt_loading.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/error.h"
#include "loom/core/log.h"

namespace loom::serve {

Teacher::Teacher(const std::string& path, const nn::GptConfig& student, double alpha, double temperature)
    : alpha_(alpha), temperature_(temperature) {
  gpt_ = load_gpt(checkpoint::Checkpoint::open(path), student.n_head);
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

// The teacher's logits a few rows at a time (at most kChunkBytes of them): its whole-vocabulary
// logits of a micro-batch, (B, T, V), are never held at once, whichever columns this rank keeps.
nn::DistillTargets Teacher::targets(const Tensor& tokens, const nn::Shard& vocab, const Tensor& reuse) {
  constexpr int64_t kChunkBytes = 4 << 20;
  const int64_t n = tokens.numel(), v_all = gpt_->config().vocab_size, v = v_all / vocab.parts, begin = vocab.index * v;
  const int64_t c = gpt_->config().d_model;
  const Tensor hidden = gpt_->forward_hidden(tokens, ctx_).view({n, c});
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (v_all * static_cast<int64_t>(sizeof(float))));
  if (!logits_.defined() || logits_.numel() < chunk * v_all) logits_ = Tensor::zeros({chunk * v_all}, DType::kF32);
  Tensor soft = reuse.defined() && reuse.numel() == n * v ? reuse : Tensor::zeros({n, v}, DType::kF32);
  float* p = soft.data<float>();
  const double inv_t = 1.0 / temperature_;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    gpt_->head_logits(hidden.slice_rows(r0, r0 + rows), logits_.slice_rows(0, rows * v_all));
    const float* z = logits_.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = z + i * v_all;
      const double mx = *std::max_element(row, row + v_all);
      double sum = 0;
      for (int64_t j = 0; j < v_all; ++j) sum += std::exp((row[j] - mx) * inv_t);
      float* out = p + (r0 + i) * v;
      for (int64_t j = 0; j < v; ++j) out[j] = static_cast<float>(std::exp((row[begin + j] - mx) * inv_t) / sum);
    }
  }
  return {.soft = soft, .alpha = alpha_, .temperature = temperature_};
}

}  // namespace loom::serve
