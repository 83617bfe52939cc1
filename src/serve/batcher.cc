#include "loom/serve/batcher.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <span>

#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/core/rng.h"
#include "loom/core/threads.h"

namespace loom::serve {
namespace {

using Clock = std::chrono::steady_clock;

// `end`, less a UTF-8 character s[..end) ends in the middle of: a byte model makes one byte
// at a time, and a piece must not split a character that the next bytes complete.
size_t whole_characters(const std::string& s, size_t end) {
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto b = static_cast<unsigned char>(s[end - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t length = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return length > back ? end - back : end;
  }
  return end;
}

}  // namespace

Generation::Event Generation::next() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty(); });
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::vector<Generation::Event> Generation::next_all() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty(); });
  std::vector<Event> all(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return all;
}

void Generation::cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
}

int64_t Generation::completion_tokens() const {
  std::lock_guard lock(mu_);
  return made_;
}

bool Generation::write_through(Writer write) {
  std::lock_guard write_lock(write_mu_);
  if (write) {
    std::lock_guard lock(mu_);
    if (!events_.empty()) return false;  // those go first, in order
  }
  write_ = std::move(write);
  return true;
}

void Generation::add(Event e) {
  std::lock_guard lock(mu_);
  pending_.push_back(std::move(e));
}

void Generation::flush() {
  std::lock_guard write_lock(write_mu_);  // throughout: the events go out in order, one way or the other
  std::vector<Event> events;
  {
    std::lock_guard lock(mu_);
    events.swap(pending_);
  }
  if (events.empty()) return;  // an earlier flush took them
  if (write_) {
    const Took took = write_(events);
    if (took != Took::kAll) write_ = nullptr;  // every later event waits for next()
    if (took != Took::kNone) {
      const Event& last = events.back();
      if (!last.done) return;
      events = {Event{.done = true, .finish = last.finish, .written = true}};
    }
  }
  {
    std::lock_guard lock(mu_);
    std::move(events.begin(), events.end(), std::back_inserter(events_));
  }
  cv_.notify_all();
}

struct Batcher::Sequence {
  GenerationRequest request;
  std::shared_ptr<Generation> generation;
  std::vector<int32_t> tokens;  // the prompt, then what was made
  std::optional<nn::KvCache> cache;
  Sampler sampler;
  Rng rng;
  std::string out;  // the completion so far
  size_t sent = 0;  // of out, in events already
  int64_t made = 0;
  bool looked_up = false;  // in the prefix cache
  Clock::time_point last;  // arrival, then each token

  Sequence(GenerationRequest r, int64_t vocab)
      : request(std::move(r)), generation(std::make_shared<Generation>()), tokens(request.prompt), sampler(vocab),
        rng(request.seed, /*stream=*/3), last(Clock::now()) {}
  bool cancelled() const {
    std::lock_guard lock(generation->mu_);
    return generation->cancelled_;
  }
};

Batcher::Batcher(const nn::Gpt& gpt, BatcherLimits limits, std::function<void(const BatchStep&)> on_step)
    : gpt_(gpt), limits_(limits), on_step_(std::move(on_step)) {
  LOOM_CHECK(limits.max_batch >= 1 && limits.token_budget >= 1 && limits.queue >= 0 && limits.threads >= 1 &&
             limits.lanes >= 1 && limits.kv_pages >= nn::KvPagePool::pages_for(gpt.config().seq_len));
  pages_ = std::make_shared<nn::KvPagePool>(gpt.config(), limits.kv_pages, limits.kv_dtype);
  if (limits.prefix_cache_bytes > 0)
    prefix_ = std::make_unique<PrefixCache>(limits.prefix_cache_bytes, gpt.config().n_layer * 2 * pages_->row_bytes());
  tokens_.thread = std::thread([this] { courier_loop(tokens_, limits_.events_nice); });
  ends_.thread = std::thread([this] { courier_loop(ends_, 0); });
  running_.resize(static_cast<size_t>(limits.lanes));
  for (size_t lane = 0; lane < running_.size(); ++lane) lanes_.emplace_back([this, lane] { loop(lane); });
}

Batcher::~Batcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : lanes_) t.join();  // each lane's last hand-over tells its running requests
  {
    std::lock_guard lock(mu_);  // and then those between lanes, and the queued ones
    for (const auto* waiting : {&moving_, &queue_})
      for (const auto& s : *waiting) s->generation->end("cancelled");
  }
  for (Courier* c : {&tokens_, &ends_}) {
    {
      std::lock_guard lock(c->mu);
      c->stop = true;
    }
    c->cv.notify_all();
    c->thread.join();
  }
}

void Batcher::deliver(Courier& courier, Outbox generations) {
  if (generations.empty()) return;
  {
    std::lock_guard lock(courier.mu);
    courier.box.insert(courier.box.end(), std::make_move_iterator(generations.begin()),
                       std::make_move_iterator(generations.end()));
  }
  courier.cv.notify_one();
}

void Batcher::courier_loop(Courier& courier, int nice) {
  if (nice > 0) {  // this thread only (Linux: a thread id names one thread)
    const auto self = static_cast<id_t>(gettid());
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, self);
    if (errno == 0 && setpriority(PRIO_PROCESS, self, std::min(19, now + nice)) != 0)
      log_warn(cat("serve: the delivery thread's niceness stays ", now, ": ", std::strerror(errno)));
  }
  Outbox generations;
  for (;;) {
    {
      std::unique_lock lock(courier.mu);
      courier.cv.wait(lock, [&] { return courier.stop || !courier.box.empty(); });
      if (courier.box.empty()) return;  // stopping, and everything handed over was flushed
      generations.swap(courier.box);
    }
    // A generation handed over by several steps (the thread fell behind them) is flushed
    // once: its stream gets all those tokens in one write.
    std::sort(generations.begin(), generations.end());
    generations.erase(std::unique(generations.begin(), generations.end()), generations.end());
    for (const std::shared_ptr<Generation>& g : generations) g->flush();
    generations.clear();
  }
}

std::shared_ptr<Generation> Batcher::submit(GenerationRequest request) {
  auto s = std::make_unique<Sequence>(std::move(request), gpt_.config().vocab_size);
  std::shared_ptr<Generation> g = s->generation;
  g->prompt_tokens_ = static_cast<int64_t>(s->tokens.size());
  if (s->request.max_tokens == 0) {
    g->end("length");
    return g;
  }
  {
    std::lock_guard lock(mu_);
    // Beyond the running batch's free places, `queue` may wait.
    const int64_t places = std::max<int64_t>(0, limits_.max_batch - static_cast<int64_t>(running_count_));
    if (static_cast<int64_t>(queue_.size()) >= limits_.queue + places) return nullptr;
    queue_.push_back(std::move(s));
  }
  cv_.notify_all();
  return g;
}

int64_t Batcher::queued() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t Batcher::running() const {
  std::lock_guard lock(mu_);
  return running_count_;
}

int64_t Batcher::caches_in_use() const {
  std::lock_guard lock(mu_);
  return running_count_;
}

int64_t Batcher::pages_in_use() const { return pages_->total() - pages_->free(); }

bool Batcher::fewest(size_t lane) const {
  for (const auto& other : running_)
    if (other.size() < running_[lane].size()) return false;
  return true;
}

bool Batcher::may_admit(size_t lane) const {  // the lane with the fewest sequences takes the next
  return fewest(lane) && (!moving_.empty() || (!queue_.empty() && running_count_ < limits_.max_batch));
}

void Batcher::rebalance(size_t lane) {
  size_t least = running_[lane].size();
  for (const auto& other : running_) least = std::min(least, other.size());
  if (running_[lane].size() < least + 2) return;
  for (size_t n = (running_[lane].size() - least) / 2; n > 0; --n) {
    moving_.push_back(std::move(running_[lane].back()));
    running_[lane].pop_back();
  }
  cv_.notify_all();  // a lane with none waits for some
}

void Batcher::admit(size_t lane) {
  while (!moving_.empty() && fewest(lane)) {
    running_[lane].push_back(std::move(moving_.front()));
    moving_.pop_front();
  }
  const int64_t window = gpt_.config().seq_len;
  while (fewest(lane) && !queue_.empty() && running_count_ < limits_.max_batch) {
    // The positions this request can hold at once: its prompt's last window and what it
    // makes, at most a window (past it the cache starts again from the last half window).
    Sequence& s = *queue_.front();
    const int64_t prompt = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), window);
    s.cache = gpt_.make_cache(pages_, std::min(window, prompt + s.request.max_tokens));
    if (!s.cache) break;  // waits, first come first served, for pages to be given back
    running_[lane].push_back(std::move(queue_.front()));
    queue_.pop_front();
    ++running_count_;
  }
}

Batcher::Made Batcher::advance(Sequence& s, const float* logits) {
  const int32_t token = s.sampler.pick(logits, s.request.sampling, s.rng);
  s.tokens.push_back(token);
  ++s.made;
  const Clock::time_point now = Clock::now();
  Made made{.first = s.made == 1, .seconds = std::chrono::duration<double>(now - s.last).count()};
  s.last = now;
  if (s.request.tokenizer) {
    s.out += s.request.tokenizer->token_bytes(token);
  } else {
    s.out += cat(s.made > 1 ? " " : "", token);
  }
  size_t ready = s.out.size();
  std::string finish;
  for (const std::string& stop : s.request.stop) {
    if (s.out.ends_with(stop)) {  // the stop sequence itself is not returned
      ready = s.out.size() - stop.size();
      finish = "stop";
      break;
    }
    for (size_t k = std::min(stop.size() - 1, s.out.size()); k > 0; --k)  // may still become `stop`
      if (s.out.compare(s.out.size() - k, k, stop, 0, k) == 0) {
        ready = std::min(ready, s.out.size() - k);
        break;
      }
  }
  if (finish.empty() && s.made >= s.request.max_tokens) finish = "length", ready = s.out.size();
  if (s.request.tokenizer && finish != "length") ready = whole_characters(s.out, ready);
  Generation::Event e{.piece = s.out.substr(s.sent, ready - s.sent), .done = !finish.empty(), .finish = finish};
  s.sent = ready;
  {
    std::lock_guard lock(s.generation->mu_);
    s.generation->made_ = s.made;
  }
  if (e.done) {
    made.finished = true;
    made.final = std::move(e);  // pushed once the sequence has left the batch and freed its cache
  } else if (!e.piece.empty()) {
    made.event = std::move(e);
  }
  return made;
}

void Batcher::loop(size_t lane) {
  set_compute_threads(limits_.threads);
  const int64_t vocab = gpt_.config().vocab_size;
  Arena arena;
  std::vector<Arena> groups(static_cast<size_t>(limits_.threads));
  std::vector<std::unique_ptr<Sequence>>& running = running_[lane];
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || may_admit(lane) || !running.empty(); });
      if (stop_) break;
      rebalance(lane);
      admit(lane);
    }
    const Clock::time_point step_start = Clock::now();
    // One step: every running sequence whose rows fit the token budget (the first always).
    std::vector<Sequence*> batch;
    std::vector<std::span<const int32_t>> rows;
    std::vector<nn::KvCache*> caches;
    int64_t total = 0;
    for (auto& s : running) {
      if (s->cancelled()) continue;
      const auto held = static_cast<int64_t>(s->tokens.size());
      // A new request whose whole prompt fits its cache starts from the longest kept prompt
      // it begins with, and reads the rest (at least its last token, whose logits it needs).
      const bool whole_prompt = s->made == 0 && held <= s->cache->capacity();
      if (whole_prompt && prefix_ && s->cache->length == 0 && !s->looked_up) {
        prefix_->restore(s->tokens, held - 1, *s->cache);
        s->looked_up = true;
      }
      const int64_t n = whole_prompt ? held - s->cache->length : s->cache->next_rows(held);
      if (!batch.empty() && (total + n > limits_.token_budget)) continue;
      if (s->cache->full()) s->cache->length = 0;
      batch.push_back(s.get());
      rows.push_back(std::span<const int32_t>(s->tokens).last(static_cast<size_t>(n)));
      caches.push_back(&*s->cache);
      total += n;
    }
    BatchStep step{.sequences = static_cast<int64_t>(batch.size()), .rows = total};
    std::vector<std::pair<Sequence*, Generation::Event>> finished;
    Outbox out, ends;  // generations with events added; ends: their first or last events among them
    if (!batch.empty()) {
      // Each compute thread samples its own group's tokens as soon as it has their logits.
      std::vector<Made> made(batch.size());
      const Clock::time_point t0 = Clock::now();
      gpt_.decode_grouped(rows, caches, groups, arena, [&](int64_t first, const Tensor& logits) {
        for (int64_t i = 0; i < logits.dim(0); ++i) {
          const auto s = static_cast<size_t>(first + i);
          made[s] = advance(*batch[s], logits.data<float>() + i * vocab);
        }
      });
      step.forward_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      for (size_t i = 0; i < batch.size(); ++i) {
        Sequence& s = *batch[i];
        // After its prompt's step the cache holds the whole prompt (and the first token's
        // position is not yet written): kept for the requests that begin the same way.
        if (prefix_ && made[i].first && static_cast<int64_t>(s.request.prompt.size()) <= s.cache->capacity())
          prefix_->keep(s.request.prompt, *s.cache);
        step.tokens.emplace_back(made[i].first, made[i].seconds);
        if (made[i].event) {
          batch[i]->generation->add(std::move(*made[i].event));
          (made[i].first || made[i].finished ? ends : out).push_back(batch[i]->generation);
        }
        if (made[i].finished) finished.emplace_back(batch[i], std::move(made[i].final));
      }
    }
    // Finished and cancelled sequences leave the batch and free their caches; only then are
    // their last events sent, so that whoever reads them sees the place free.
    // (Added only then, too: the delivery thread may be flushing them now.)
    std::vector<std::pair<std::shared_ptr<Generation>, Generation::Event>> last;
    {
      std::lock_guard lock(mu_);
      std::erase_if(running, [&](std::unique_ptr<Sequence>& s) {
        auto done = std::find_if(finished.begin(), finished.end(), [&](const auto& f) { return f.first == s.get(); });
        if (done != finished.end()) last.emplace_back(s->generation, std::move(done->second));
        else if (s->cancelled()) last.emplace_back(s->generation, Generation::Event{.piece = "", .done = true, .finish = "cancelled"});
        else return false;
        s->cache.reset();  // its pages go back to the pool
        --running_count_;
        return true;
      });
    }
    if (!last.empty()) cv_.notify_all();  // another lane may now be the one to admit
    for (auto& [generation, event] : last) {
      generation->add(std::move(event));
      ends.push_back(generation);
    }
    deliver(tokens_, std::move(out));
    deliver(ends_, std::move(ends));
    step.seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    if (on_step_ && step.sequences > 0) on_step_(step);
  }
  // Stopping: whoever waits is told, after what was added before.
  std::lock_guard lock(mu_);
  for (const auto& s : running) s->generation->end("cancelled");
}

}  // namespace loom::serve
