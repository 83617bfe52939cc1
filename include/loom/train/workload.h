// What `loom train` learns: the model (an nn::Model, this rank's part and piece of it) and
// the examples it learns from (data::Examples), built from the config and checked before
// anything is written. GPT learns next tokens from a token file; MLP classifies images.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/data/examples.h"
#include "loom/data/tokenizer.h"
#include "loom/nn/gpt.h"
#include "loom/nn/model.h"
#include "loom/serve/teacher.h"
#include "loom/train/train_config.h"

namespace loom::train {

struct Workload {
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<data::Examples> train;
  std::unique_ptr<data::Examples> val;  // null without validation data
  std::unique_ptr<serve::Teacher> teacher;     // [training] teacher, on the ranks that compute a loss
  int64_t eval_batch = 1;               // examples per validation batch
  // The tokenizer that made the token files (data.tokenizer): kept with the run and its
  // checkpoints. Null for bytes and for models that read no text.
  std::unique_ptr<data::Tokenizer> tokenizer;
  // The model's kind and shape, saved in checkpoints so sample/eval can rebuild it.
  nlohmann::json model_json() const;
};

// Loads and validates the data (InputError naming the file) and builds the model, or the
// part of a GPT that `part` names (a pipeline stage), split over `tp` (its tensor-parallel
// piece; the serial model when tp.parts = 1). `init`: false leaves the weights zero, for a
// caller that loads every one of them (a resume), sparing the random initialization.
// `lead`: this process hashes a manifest's shards (data.verify = "hash"), before the run
// directory is written; the others check their sizes and headers.
Workload make_workload(const TrainConfig& t, const nn::GptPart& part = {}, const nn::Shard& tp = {}, bool init = true,
                       bool lead = true);

// Checks every token is below the vocabulary size; InputError naming the file otherwise.
void check_vocab(const std::vector<uint16_t>& tokens, int64_t vocab, const std::string& path);

}  // namespace loom::train
