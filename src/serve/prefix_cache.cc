#include "loom/serve/prefix_cache.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom::serve {
namespace {

int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const auto end = std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(std::min(a.size(), b.size())), b.begin());
  return end.first - a.begin();
}

}  // namespace

PrefixCache::PrefixCache(int64_t budget_bytes, int64_t position_bytes)
    : budget_(budget_bytes), position_bytes_(position_bytes) {
  LOOM_CHECK(budget_bytes > 0 && position_bytes > 0);
}

int64_t PrefixCache::restore(std::span<const int32_t> prompt, int64_t limit, nn::KvCache& cache) {
  LOOM_CHECK(cache.length == 0 && limit >= 0 && limit <= static_cast<int64_t>(prompt.size()));
  const std::span<const int32_t> wanted = prompt.first(static_cast<size_t>(limit));
  std::lock_guard lock(mu_);
  auto best = entries_.end();
  int64_t longest = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const int64_t n = common_prefix(it->tokens, wanted);
    if (n > longest) longest = n, best = it;
  }
  if (longest == 0) return 0;
  cache.restore(longest, best->kv.data(), static_cast<int64_t>(best->tokens.size()));
  entries_.splice(entries_.begin(), entries_, best);
  ++hits_;
  reused_ += longest;
  return longest;
}

void PrefixCache::keep(std::span<const int32_t> prompt, const nn::KvCache& cache) {
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t size = n * position_bytes_;
  if (n == 0 || size > budget_) return;
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (common_prefix(it->tokens, prompt) == n) {  // kept already, or within a longer one
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  while (bytes_ + size > budget_) {
    bytes_ -= static_cast<int64_t>(entries_.back().kv.size());
    entries_.pop_back();
  }
  Entry& e = entries_.emplace_front(Entry{{prompt.begin(), prompt.end()}, std::vector<std::byte>(static_cast<size_t>(size))});
  cache.save(n, e.kv.data());
  bytes_ += size;
}

int64_t PrefixCache::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

int64_t PrefixCache::reused_tokens() const {
  std::lock_guard lock(mu_);
  return reused_;
}

int64_t PrefixCache::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace loom::serve
