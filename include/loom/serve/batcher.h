// Continuous batching for `loom serve` (docs/serving.md): a model's decoding threads (lanes)
// each run their admitted requests' next tokens in one Gpt::decode_grouped per step, and
// requests join and leave between steps (iteration-level scheduling); one more thread hands
// each step's events to the requests. Each request decodes with a key/value cache from a
// fixed pool; a request that cannot be admitted waits in a bounded queue.
// Thread-safety: submit, Generation::next and Generation::cancel from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "loom/data/tokenizer.h"
#include "loom/nn/gpt.h"
#include "loom/serve/prefix_cache.h"
#include "loom/serve/sampler.h"

namespace loom::serve {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // at least one token, ids < vocab_size
  int64_t max_tokens = 16;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // text models only
  // The model's tokenizer: output is the tokens' text. Null: the model has none, and the
  // output is token ids separated by spaces.
  std::shared_ptr<const data::Tokenizer> tokenizer;
};

// One request's output as it becomes final: text is held back while it may begin a stop
// sequence or ends inside a UTF-8 character.
class Generation {
 public:
  struct Event {
    std::string piece;
    bool done = false;
    std::string finish;  // with done: "length", "stop" or "cancelled"
    bool written = false;  // from next(): the writer (write_through) took the last event itself
  };
  Event next();    // blocks until there is one
  std::vector<Event> next_all();  // every event that waits, in order; blocks until there is one
  void cancel();   // the client left: dropped at the next step, its cache freed
  // Events from now on go to `write` on the thread that hands them out, instead of waiting
  // for next(): no wake-up of the reader per event. It takes each hand-over's events for
  // this generation at once (several when the hand-overs came faster than they went out),
  // and says what it did with them (Took). Once it has taken the last event, next() returns
  // an event with `written`.
  // It attaches only while no event waits for next() (false: read those first).
  // write_through(nullptr) detaches it, and returns only when no call is under way.
  enum class Took {
    kAll,       // took them; it takes the next ones too
    kAllLast,   // took them (the reader finishes what it could not write at once), but no
                // later ones: those wait for next()
    kNone,      // refused them (its connection failed): these and every later one wait for next()
  };
  using Writer = std::function<Took(std::span<const Event>)>;
  bool write_through(Writer write);
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const;  // so far

 private:
  friend class Batcher;
  // The decoding lane adds a sequence's events in order; flush() puts out every event added
  // before it, from whichever thread calls it (the delivery thread, or the batcher as it
  // stops): one flush at a time, each taking all that waits, so the order holds whichever
  // thread flushes.
  void add(Event e);
  void flush();
  void end(const char* finish) {  // a last event with no text, out at once
    add({.piece = "", .done = true, .finish = finish});
    flush();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::mutex write_mu_;  // held while the writer runs: apart from mu_, which the steps take
  Writer write_;
  std::vector<Event> pending_;  // added, not yet flushed (under mu_)
  bool cancelled_ = false;
  int64_t prompt_tokens_ = 0, made_ = 0;
};

struct BatcherLimits {
  int64_t max_batch = 16;     // sequences per step
  int64_t token_budget = 2048;  // rows per step (a prefill counts its tokens); one sequence always runs
  int64_t queue = 64;         // requests waiting for a place in a full batch; beyond them submit refuses
  // Key/value pages (nn::KvPagePool, kPositions positions each), the memory budget: a request
  // takes the pages for its prompt and max_tokens (at most a window's) when it joins.
  // REQUIRES: at least one window's.
  int64_t kv_pages = 256;
  DType kv_dtype = DType::kF32;  // the pages' (kBF16 for an f32 model: half the memory)
  // Decoding threads (lanes), each stepping its own sequences with no join between them: a
  // lane delayed (preempted, or with a prompt to read) holds up only its own. A request joins
  // the lane with the fewest sequences. max_batch bounds all lanes together, token_budget
  // each lane's step.
  int lanes = 1;
  // Added to the niceness of the delivery thread for the tokens between a stream's first and
  // last events (0 to 19): with every core busy the lanes then come first, and each write it
  // makes carries all the tokens its stream got meanwhile; with a core to spare it writes each
  // token as it comes, as at 0. A stream's first and last events go out at the lanes' niceness.
  int events_nice = 0;
  // Bytes of prompts' keys and values kept for later prompts that begin the same way
  // (PrefixCache); 0: none kept.
  int64_t prefix_cache_bytes = 0;
  // OpenMP threads of each lane's kernels. A thread's OpenMP team size is its own
  // (omp_set_num_threads on the main thread does not reach it), so each lane sets it.
  int threads = 1;
};

// What each step did, for metrics.
struct BatchStep {
  int64_t sequences = 0, rows = 0;
  double forward_seconds = 0, seconds = 0;  // Gpt::decode_grouped's (sampling included), and the whole step's
  std::vector<std::pair<bool, double>> tokens;  // per token made: first of its request?, seconds since the last
};

class Batcher {
 public:
  Batcher(const nn::Gpt& gpt, BatcherLimits limits, std::function<void(const BatchStep&)> on_step);
  ~Batcher();  // cancels what is running and queued, and joins the threads
  // The request's generation, or null when the queue is full.
  std::shared_ptr<Generation> submit(GenerationRequest request);
  int64_t queued() const;
  int64_t running() const;
  int64_t caches_in_use() const;  // running requests, each holding its pages
  int64_t pages_in_use() const;
  int64_t pages_total() const { return limits_.kv_pages; }
  const PrefixCache* prefix_cache() const { return prefix_.get(); }  // null: none kept

 private:
  struct Sequence;
  using Outbox = std::vector<std::shared_ptr<Generation>>;  // generations with events added, to flush
  void loop(size_t lane);
  // REQUIRES for these: mu_ held.
  bool fewest(size_t lane) const;  // no lane runs fewer sequences
  bool may_admit(size_t lane) const;
  void admit(size_t lane);
  // A lane running two sequences more than another hands the difference's half to moving_,
  // for the lanes with the fewest to take at their next step: lanes that run at different
  // speeds (one shares its core with the HTTP threads) or whose requests end at different
  // times keep even shares, and none sits idle while another has sequences waiting on it.
  void rebalance(size_t lane);
  // What one sequence's step made: its token (first of its request?, seconds since its
  // last), the text to send now, if any, and once it has finished its last event, sent after
  // it has left the batch.
  struct Made {
    bool first = false;
    double seconds = 0;
    std::optional<Generation::Event> event;
    bool finished = false;
    Generation::Event final;
  };
  // Samples, holds back and puts out one sequence's new token. Touches that sequence only:
  // the compute threads run it for their own groups' sequences side by side.
  Made advance(Sequence& s, const float* logits);
  // A step's events go to a delivery thread in one hand-over, which flushes them: writing
  // each out (Generation::write_through), or waking the request's HTTP thread to, happens
  // there, beside the next step's forward, not inside the step every request waits on.
  // Two such threads (couriers): one for the tokens between a stream's first and last, at
  // limits_.events_nice, and one at the lanes' niceness for streams whose first or last event
  // is in the hand-over, so that neither a client's first token nor the end that lets it ask
  // again waits behind the lanes.
  struct Courier {
    std::mutex mu;
    std::condition_variable cv;
    Outbox box;  // handed over, not yet pushed
    bool stop = false;
    std::thread thread;  // started before the lanes, joined after them
  };
  static void deliver(Courier& courier, Outbox generations);
  static void courier_loop(Courier& courier, int nice);

  const nn::Gpt& gpt_;
  BatcherLimits limits_;
  std::function<void(const BatchStep&)> on_step_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::deque<std::unique_ptr<Sequence>> moving_;  // running, between lanes (rebalance): caches held, counted running
  // Each lane's running sequences: touched by its loop only, sized under mu_.
  std::vector<std::vector<std::unique_ptr<Sequence>>> running_;
  std::shared_ptr<nn::KvPagePool> pages_;
  std::unique_ptr<PrefixCache> prefix_;
  int64_t running_count_ = 0;
  bool stop_ = false;
  Courier tokens_, ends_;  // tokens_: the events between a stream's first and last
  std::vector<std::thread> lanes_;
};

}  // namespace loom::serve
