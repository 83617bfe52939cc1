// The models `loom serve` serves (docs/serving.md, "Models, memory and routes"): every one
// named at start, loaded while they fit in the memory budget; the others load on their first
// request, and the least recently used idle ones are evicted to make room. A route is a name
// whose requests go to several models by weight (a canary).
//
// Thread-safety: every member is safe to call from the HTTP threads. A model is loaded by
// one thread at a time (others asking for it wait; other models are not held up).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"
#include "loom/nn/gpt.h"
#include "loom/serve/batcher.h"

namespace loom::serve {

struct Model {
  std::string name, path;
  std::unique_ptr<nn::Gpt> gpt;
  std::unique_ptr<Batcher> batcher;  // after gpt: destroyed first
};

// A model that could not be loaded or given room: the request that needed it gets
// `status` (503) and the message, which names the model; the server goes on.
struct ModelUnavailable : RuntimeError {
  ModelUnavailable(int status, const std::string& message) : RuntimeError(message), status(status) {}
  int status;
};

class ModelCache {
 public:
  struct Spec {
    std::string name, path;
    std::string tokenizer;  // a data::Tokenizer spec; "": the checkpoint's (serve::model_tokenizer)
  };
  using MakeBatcher = std::function<std::unique_ptr<Batcher>(const nn::Gpt&)>;
  // Opens every checkpoint now (a bad path or index is an InputError naming it), and loads
  // the weights of as many as fit in `memory_bytes` (0: no limit), in the order given.
  // int8: f32 models compute with int8 weights (quantized as they load); int8 checkpoints
  // always do. n_head: what a bare safetensors file's model has (it cannot say).
  ModelCache(const std::vector<Spec>& specs, int64_t n_head, int64_t memory_bytes, bool int8, MakeBatcher make_batcher);
  ~ModelCache();

  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  int64_t vocab_size(const std::string& name) const;  // REQUIRES: has(name)
  // Its tokenizer; null when it has none. REQUIRES: has(name)
  std::shared_ptr<const data::Tokenizer> tokenizer(const std::string& name) const;
  // The model, loaded (now, if it was not: evicting the least recently used models that
  // serve no request to stay within the budget). Throws ModelUnavailable when its
  // checkpoint fails to load or it cannot have room. REQUIRES: has(name).
  std::shared_ptr<Model> get(const std::string& name);
  // The models loaded now, by name.
  std::map<std::string, std::shared_ptr<Model>> loaded() const;

  struct Stats {
    uint64_t hits = 0, loads = 0, evictions = 0, failures = 0;
    int64_t bytes = 0;  // weights loaded now
  };
  Stats stats() const;

 private:
  struct Entry;
  std::shared_ptr<Model> load(Entry& e, std::unique_lock<std::mutex>& lock);
  bool make_room(int64_t bytes, const Entry& keep);

  int64_t n_head_;
  int64_t budget_;
  MakeBatcher make_batcher_;
  mutable std::mutex mu_;
  std::condition_variable loaded_;  // a load ended (well or not)
  std::map<std::string, std::unique_ptr<Entry>> entries_;
  uint64_t clock_ = 0;  // use order, for least recently used
  Stats stats_;
};

// `--route NAME=A:W,B:W...`: requests for NAME go to A, B, ... in proportion to the weights,
// interleaved as evenly as the weights allow (smooth weighted round robin: of every W_A + W_B
// requests, exactly W_A go to A). InputError naming the spec when malformed.
class Route {
 public:
  explicit Route(const std::string& spec);
  const std::string& name() const { return name_; }
  const std::vector<std::pair<std::string, int64_t>>& targets() const { return targets_; }
  std::string pick();  // thread-safe

 private:
  std::string name_;
  std::vector<std::pair<std::string, int64_t>> targets_;
  std::vector<int64_t> current_;
  std::mutex mu_;
};

}  // namespace loom::serve
