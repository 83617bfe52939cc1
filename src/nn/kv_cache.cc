// Paged key/value memory for incremental decoding (loom/nn/gpt.h, KvPagePool and KvCache).
#include <algorithm>
#include <cstring>

#include "loom/core/error.h"
#include "loom/nn/gpt.h"

namespace loom::nn {

KvPagePool::KvPagePool(const GptConfig& config, int64_t pages, DType dtype)
    : total_(pages),
      n_layer_(config.n_layer),
      c_(config.d_model),
      storage_(Tensor::zeros({pages, config.n_layer, 2, kPositions, config.d_model}, dtype)) {
  LOOM_CHECK(pages >= 1);
  for (int64_t p = pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));  // page 0 first
}

int64_t KvPagePool::page_bytes(const GptConfig& config, DType dtype) {
  return config.n_layer * 2 * kPositions * config.d_model * static_cast<int64_t>(dtype_size(dtype));
}

int64_t KvPagePool::free() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(free_.size());
}

std::optional<std::vector<int32_t>> KvPagePool::take(int64_t n) {
  std::lock_guard lock(mu_);
  if (n > static_cast<int64_t>(free_.size())) return std::nullopt;
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  return out;
}

void KvPagePool::give(const std::vector<int32_t>& pages) {
  std::lock_guard lock(mu_);
  free_.insert(free_.end(), pages.rbegin(), pages.rend());
}

std::byte* KvPagePool::rows(int32_t page, int64_t layer, int kv) const {
  LOOM_CHECK(page >= 0 && page < total_ && layer >= 0 && layer < n_layer_);
  const int64_t at = ((page * n_layer_ + layer) * 2 + kv) * kPositions * c_;
  return static_cast<std::byte*>(storage_.raw()) + at * static_cast<int64_t>(dtype_size(storage_.dtype()));
}

KvCache::KvCache(std::shared_ptr<KvPagePool> pool, std::vector<int32_t> pages, int64_t capacity)
    : pool_(std::move(pool)), pages_(std::move(pages)), capacity_(capacity) {
  LOOM_CHECK_EQ(static_cast<int64_t>(pages_.size()), KvPagePool::pages_for(capacity));
}

KvCache& KvCache::operator=(KvCache&& o) noexcept {
  if (this != &o) {
    if (pool_) pool_->give(pages_);
    pool_ = std::move(o.pool_);
    pages_ = std::move(o.pages_);
    capacity_ = o.capacity_;
    length = o.length;
    o.pages_.clear();
    o.capacity_ = 0;
  }
  return *this;
}

namespace {

// Both directions walk the same order: layer, keys then values, position. The flat copy
// holds `held` positions for each layer's keys and values, of which the first n are copied.
template <typename Copy>
void each_run(const KvPagePool& pool, const std::vector<int32_t>& pages, int64_t n, int64_t held, Copy copy) {
  const int64_t page = KvPagePool::kPositions, row = pool.row_bytes();
  for (int64_t l = 0, block = 0; l < pool.n_layer(); ++l)
    for (int kv = 0; kv < 2; ++kv, ++block)
      for (int64_t p0 = 0; p0 < n; p0 += page)
        copy(pool.rows(pages[static_cast<size_t>(p0 / page)], l, kv), (block * held + p0) * row,
             std::min(page, n - p0) * row);
}

}  // namespace

void KvCache::save(int64_t n, std::byte* out) const {
  LOOM_CHECK(n >= 0 && n <= length);
  each_run(*pool_, pages_, n, n, [&](const std::byte* rows, int64_t at, int64_t bytes) {
    std::memcpy(out + at, rows, static_cast<size_t>(bytes));
  });
}

void KvCache::restore(int64_t n, const std::byte* in, int64_t held) {
  LOOM_CHECK(n >= 0 && n <= capacity() && n <= held);
  each_run(*pool_, pages_, n, held, [&](std::byte* rows, int64_t at, int64_t bytes) {
    std::memcpy(rows, in + at, static_cast<size_t>(bytes));
  });
  length = n;
}

KvCache::~KvCache() {
  if (pool_) pool_->give(pages_);
}

}  // namespace loom::nn
