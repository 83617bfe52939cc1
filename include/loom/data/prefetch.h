// Batches made ahead of the step that needs them (docs/data.md, "Prefetch"): a background
// thread makes batch n, n + 1, ... (their items given by a function of n) into a bounded
// queue, so reading the shards' pages and copying tokens overlaps the step before. The
// trainer takes them in order and learns how long it waited.
// Thread-safety: take() from one thread; the reader is the object's own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/data/examples.h"

namespace loom::data {

class Prefetcher {
 public:
  // The items of batch n (n counted by the caller: e.g. step * micro-batches + micro-batch).
  // Called on the reader's thread only.
  using ItemsOf = std::function<std::vector<int64_t>(int64_t n)>;
  // Makes batches first, first + 1, ... up to `depth` ahead (depth >= 1).
  Prefetcher(const Examples& examples, ItemsOf items_of, int64_t first, int depth);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Batch n, waiting for the reader when it is behind (the wait in milliseconds is added
  // to *waited_ms). Batches before n that were never taken are dropped; asking for one the
  // reader has passed makes it here. An error the reader met making batch n is thrown here.
  Batch take(int64_t n, double* waited_ms);

 private:
  void run();
  struct Made {
    int64_t n;
    Batch batch;
    std::exception_ptr error;
  };
  const Examples& examples_;
  ItemsOf items_of_;
  const size_t depth_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Made> ready_;
  int64_t next_;         // the batch the reader makes next
  uint64_t restarts_ = 0;  // bumped when take() moves the reader: a batch in the making is dropped
  bool stop_ = false;
  std::thread reader_;
};

}  // namespace loom::data
