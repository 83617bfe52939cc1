// Key/value memory for incremental decoding (docs/serving.md, "Continuous batching"): a
// pool of pages allocated up front, and the cache of one sequence's keys and values in
// pages taken from it. Gpt::make_cache makes one; Gpt::decode fills it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "loom/nn/gpt_config.h"
#include "loom/core/tensor.h"

namespace loom::nn {

// Key/value memory for incremental decoding in pages (docs/serving.md, "Continuous
// batching"): `total` pages of kPositions positions, each holding every layer's keys and
// values for its positions, in one allocation made up front (the memory budget). A cache
// takes the pages its capacity needs and gives them back when it is destroyed.
// Thread-safety: take and give lock; rows are written by the cache's one decoding thread.
class KvPagePool {
 public:
  static constexpr int64_t kPositions = 16;
  KvPagePool(const GptConfig& config, int64_t pages, DType dtype = DType::kF32);
  static int64_t pages_for(int64_t positions) { return (positions + kPositions - 1) / kPositions; }
  // Bytes of one page (every layer's keys and values for kPositions positions).
  static int64_t page_bytes(const GptConfig& config, DType dtype = DType::kF32);
  int64_t total() const { return total_; }
  int64_t free() const;
  // `n` pages, or none when fewer are free.
  std::optional<std::vector<int32_t>> take(int64_t n);
  void give(const std::vector<int32_t>& pages);
  // The first key (kv 0) or value (kv 1) row of layer `layer` in `page`; rows are C apart.
  std::byte* rows(int32_t page, int64_t layer, int kv) const;
  DType dtype() const { return storage_.dtype(); }
  int64_t n_layer() const { return n_layer_; }
  int64_t row_bytes() const { return c_ * static_cast<int64_t>(dtype_size(storage_.dtype())); }  // one position of one layer's keys

 private:
  int64_t total_, n_layer_, c_;
  Tensor storage_;  // (pages, n_layer, 2, kPositions, C)
  mutable std::mutex mu_;
  std::vector<int32_t> free_;
};

// Keys and values of one sequence's tokens so far, for incremental decoding
// (docs/serving.md): position p's of layer l in page pages[p / kPositions], row p % kPositions.
class KvCache {
 public:
  KvCache() = default;
  // Holds `pages`, taken from pool, for `capacity` positions (Gpt::make_cache takes them).
  KvCache(std::shared_ptr<KvPagePool> pool, std::vector<int32_t> pages, int64_t capacity);
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&& o) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();  // gives the pages back

  int64_t length = 0;  // positions held
  int64_t capacity() const { return capacity_; }
  DType dtype() const { return pool_->dtype(); }  // of its keys and values (the pool's)
  int64_t pages() const { return static_cast<int64_t>(pages_.size()); }
  bool full() const { return length == capacity(); }
  // The first key (kv 0) or value (kv 1) row of layer `layer` in each of this cache's pages.
  template <typename T>
  std::vector<T*> page_rows(int64_t layer, int kv) const {
    std::vector<T*> out;
    page_rows(layer, kv, out);
    return out;
  }
  template <typename T>
  void page_rows(int64_t layer, int kv, std::vector<T*>& out) const {  // into out, reusing its memory
    out.clear();
    for (int32_t p : pages_) out.push_back(reinterpret_cast<T*>(pool_->rows(p, layer, kv)));
  }
  // Positions [0, n) of every layer's keys and values, copied out to (n_layer, 2, n, C)
  // elements of the pool's dtype at `out`; or in, as positions [0, n) of such a copy of
  // `held` positions, after which length is n. A prompt's keys and values computed once are
  // reused by a later prompt that begins the same way (the same bits: each position's keys
  // and values depend on the tokens up to it only).
  // REQUIRES: n <= length (save); n <= capacity() and n <= held (restore).
  void save(int64_t n, std::byte* out) const;
  void restore(int64_t n, const std::byte* in, int64_t held);
  // How many of a sequence's last `tokens` its next decode runs: the prompt's last window
  // first; a full cache starts again (the caller sets length 0) from the last half window,
  // since positions are absolute and cached keys cannot slide; else the one new token.
  int64_t next_rows(int64_t tokens) const {
    if (length == 0) return std::min(tokens, capacity());
    if (full()) return std::min(tokens, std::max<int64_t>(capacity() / 2, 1));
    return 1;
  }

 private:
  std::shared_ptr<KvPagePool> pool_;
  std::vector<int32_t> pages_;
  int64_t capacity_ = 0;
};

}  // namespace loom::nn
