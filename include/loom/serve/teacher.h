// Knowledge distillation's teacher ([training] teacher, docs/serving.md "Distillation"): a
// trained GPT, whole in every process that computes a loss, run forward only on the same
// tokens as the student; its softmax at the temperature is what the student's loss mixes
// in (nn::DistillTargets). Its logits are taken a few rows at a time, so that no process
// holds a micro-batch's whole (B, T, V) logits (a tensor-parallel student keeps only its
// vocabulary columns of the targets).
#pragma once

#include <memory>
#include <string>

#include "loom/nn/gpt.h"

namespace loom::serve {

class Teacher {
 public:
  // Loads training.teacher = `path` (any checkpoint `loom eval` reads; int8 ones too; a
  // bare safetensors file takes the student's n_head). InputError naming the key and the
  // numbers when its vocabulary differs from the student's or its window is shorter.
  // alpha and temperature: training.distill_alpha and distill_temperature.
  Teacher(const std::string& path, const nn::GptConfig& student, double alpha, double temperature);
  ~Teacher();

  // The teacher's probabilities at the temperature for tokens (B, T), the columns of
  // vocabulary part `vocab` (all of them when not split), with alpha and the temperature.
  // `reuse`: a tensor of the right size to write into (else a new one), so a caller with
  // one micro-batch in flight allocates once.
  nn::DistillTargets targets(const Tensor& tokens, const nn::Shard& vocab, const Tensor& reuse = {});

 private:
  std::unique_ptr<nn::Gpt> gpt_;
  nn::GptCtx ctx_;
  Tensor logits_;  // a chunk of rows' logits, reused
  double alpha_, temperature_;
};

}  // namespace loom::serve
