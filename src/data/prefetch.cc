#include "loom/data/prefetch.h"

#include <chrono>

#include "loom/core/error.h"

namespace loom::data {

Prefetcher::Prefetcher(const Examples& examples, ItemsOf items_of, int64_t first, int depth)
    : examples_(examples), items_of_(std::move(items_of)), depth_(static_cast<size_t>(depth)), next_(first) {
  LOOM_CHECK(depth >= 1);
  reader_ = std::thread([this] { run(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  reader_.join();
}

void Prefetcher::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || ready_.size() < depth_; });
    if (stop_) return;
    const int64_t n = next_;
    const uint64_t restarts = restarts_;
    lock.unlock();
    Made made{.n = n, .batch = {}, .error = nullptr};
    try {
      made.batch = examples_.batch(items_of_(n));
    } catch (...) {
      made.error = std::current_exception();
    }
    lock.lock();
    if (restarts != restarts_) continue;  // take() moved on while this one was made
    ready_.push_back(std::move(made));
    next_ = n + 1;
    changed_.notify_all();
  }
}

Batch Prefetcher::take(int64_t n, double* waited_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = [&] {
    if (waited_ms != nullptr)
      *waited_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::unique_lock lock(mu_);
  while (!ready_.empty() && ready_.front().n < n) ready_.pop_front();  // never asked for
  if ((!ready_.empty() && ready_.front().n > n) || (ready_.empty() && next_ > n)) {
    lock.unlock();  // the reader has passed it (asked for out of order): made here
    Batch b = examples_.batch(items_of_(n));
    waited();
    return b;
  }
  if (ready_.empty() && next_ < n) {  // the caller skipped ahead: the reader follows
    next_ = n;
    ++restarts_;
    changed_.notify_all();
  }
  changed_.wait(lock, [&] { return !ready_.empty(); });
  Made made = std::move(ready_.front());
  ready_.pop_front();
  changed_.notify_all();
  lock.unlock();
  waited();
  if (made.error) std::rethrow_exception(made.error);
  return std::move(made.batch);
}

}  // namespace loom::data
