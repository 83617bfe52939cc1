// `loom serve`'s server (docs/serving.md): OpenAI-style completions on loom::http::Server.
// Its handler threads parse and validate requests and hand them to each model's Batcher,
// which decodes all running requests together step by step (continuous batching); its
// Prometheus text counts requests, tokens and the batchers' and model cache's state.
#include "loom/serve/completion_server.h"

#include <openssl/crypto.h>
#include <pthread.h>
#include <signal.h>

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "loom/checkpoint/bounded_json.h"
#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/core/rng.h"
#include "loom/serve/batcher.h"
#include "loom/serve/completion_request.h"
#include "loom/serve/gpt_loading.h"
#include "loom/serve/http_server.h"
#include "loom/serve/model_cache.h"
#include "loom/serve/sampler.h"

namespace loom::serve {
namespace {


using Clock = std::chrono::steady_clock;
using nlohmann::json;


// Prometheus histogram with fixed bucket bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void add(double v) {
    std::lock_guard lock(mu_);
    ++counts_[std::upper_bound(bounds_.begin(), bounds_.end(), v - 1e-15) - bounds_.begin()];
    sum_ += v;
  }
  std::string text(const std::string& name, const std::string& help) const {
    std::lock_guard lock(mu_);
    std::string out = cat("# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += counts_[i];
      out += cat(name, "_bucket{le=\"", i < bounds_.size() ? cat(bounds_[i]) : std::string("+Inf"), "\"} ", cumulative, "\n");
    }
    return out + cat(name, "_sum ", sum_, "\n", name, "_count ", cumulative, "\n");
  }

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
};

struct Metrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (endpoint, status)
  std::atomic<uint64_t> tokens{0}, prompt_tokens{0};
  std::atomic<uint64_t> slowed{0};  // streams whose events waited for room in the client's socket
  Histogram first_token{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram per_token{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  Histogram batch{{1, 2, 4, 8, 16, 32, 64, 128}};
  Histogram forward{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}};
  Histogram step_time{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}};

  void on_step(const BatchStep& step) {
    batch.add(static_cast<double>(step.sequences));
    forward.add(step.forward_seconds);
    step_time.add(step.seconds);
    tokens += step.tokens.size();
    for (const auto& [first, seconds] : step.tokens) (first ? first_token : per_token).add(seconds);
  }

  void count(const std::string& endpoint, int status) {
    std::lock_guard lock(mu);
    ++requests[{endpoint, status}];
  }
  std::string text() {
    std::string out = "# HELP loom_requests_total HTTP requests by endpoint and status\n# TYPE loom_requests_total counter\n";
    {
      std::lock_guard lock(mu);
      for (const auto& [key, n] : requests)
        out += cat("loom_requests_total{endpoint=\"", key.first, "\",code=\"", key.second, "\"} ", n, "\n");
    }
    out += cat("# HELP loom_generated_tokens_total Tokens generated\n# TYPE loom_generated_tokens_total counter\n",
               "loom_generated_tokens_total ", tokens.load(), "\n",
               "# HELP loom_prompt_tokens_total Prompt tokens read\n# TYPE loom_prompt_tokens_total counter\n",
               "loom_prompt_tokens_total ", prompt_tokens.load(), "\n",
               "# HELP loom_streams_slowed_total Streams whose client read slower than tokens came ",
               "(their events waited for room in its socket)\n# TYPE loom_streams_slowed_total counter\n",
               "loom_streams_slowed_total ", slowed.load(), "\n",
               "");
    out += first_token.text("loom_time_to_first_token_seconds", "From a completion's arrival to its first token");
    out += per_token.text("loom_time_per_token_seconds", "Between a completion's consecutive tokens");
    out += forward.text("loom_step_forward_seconds", "One decoding step's forward (every sequence's new rows) and sampling");
    out += step_time.text("loom_step_seconds", "One decoding step: admission, forward, sampling and events");
    return out + batch.text("loom_batch_sequences", "Sequences decoded together in one step");
  }
};


class CompletionServer {
 public:
  // n_head: what a bare safetensors file cannot say (model.n_head); threads: [job] threads.
  CompletionServer(const ServerOptions& a, const std::vector<ModelCache::Spec>& specs, int64_t n_head, int threads,
         std::vector<std::unique_ptr<Route>> routes)
      : args_(a),
        started_(std::time(nullptr)),
        threads_(threads),
        lanes_(a.lanes == 0 ? threads_ : static_cast<int>(a.lanes)),
        cache_(specs, n_head, static_cast<int64_t>(a.memory_mb * (1 << 20)), quantize_named(a.quantize),
               [this](const nn::Gpt& gpt) {
                 const nn::GptConfig& g = gpt.config();
                 // --kv-cache-mb in pages; at least one window, and no more than a full batch
                 // of windows could hold at once.
                 const DType kv_dtype = kv_cache_dtype_named(args_.kv_cache_dtype);
                 const auto page_bytes = static_cast<double>(nn::KvPagePool::page_bytes(g, kv_dtype));
                 const int64_t window = nn::KvPagePool::pages_for(g.seq_len);
                 const auto budget = static_cast<int64_t>(static_cast<double>(args_.kv_cache_mb) * (1 << 20) / page_bytes);
                 const BatcherLimits limits{
                     .max_batch = args_.max_batch, .token_budget = args_.token_budget, .queue = args_.queue,
                     .kv_pages = std::clamp(budget, window, args_.max_batch * window), .kv_dtype = kv_dtype,
                     .lanes = lanes_, .events_nice = static_cast<int>(args_.events_nice),
                     .prefix_cache_bytes = static_cast<int64_t>(args_.prefix_cache_mb * (1 << 20)),
                     .threads = std::max(1, threads_ / lanes_)};
                 return std::make_unique<Batcher>(gpt, limits, [this](const BatchStep& step) { metrics_.on_step(step); });
               }) {
    for (auto& r : routes) {
      if (cache_.has(r->name()))
        throw InputError(cat("--route ", printable(r->name()), ": the name is a model's (--model)"));
      if (routes_.contains(r->name())) throw InputError(cat("--route ", printable(r->name()), ": the name is given twice"));
      for (const auto& [target, w] : r->targets())
        if (!cache_.has(target))
          throw InputError(cat("--route ", printable(r->name()), ": no model named ", printable(target), " (--model NAME=PATH)"));
      routes_[r->name()] = std::move(r);
    }
  }

  // Per model loaded: requests waiting, running, caches in use; the model cache's counts.
  std::string gauges() const {
    std::string out;
    const auto loaded = cache_.loaded();
    struct Metric {
      const char *name, *help, *type;
    };
    const Metric metrics[] = {
        {"loom_queue_depth", "Requests waiting for a place in the batch", "gauge"},
        {"loom_requests_running", "Requests in the running batch", "gauge"},
        {"loom_kv_caches_in_use", "Key/value caches held by running requests", "gauge"},
        {"loom_kv_pages_in_use", "Key/value cache pages held", "gauge"},
        {"loom_kv_pages_capacity", "Key/value cache pages of the model's budget", "gauge"},
        {"loom_prefix_cache_hits_total", "Requests that began with a kept prompt's keys and values", "counter"},
        {"loom_prefix_cache_tokens_total", "Prompt tokens whose keys and values were reused, not computed", "counter"},
        {"loom_prefix_cache_bytes", "Kept prompts' keys and values", "gauge"}};
    for (size_t k = 0; k < std::size(metrics); ++k) {
      out += cat("# HELP ", metrics[k].name, " ", metrics[k].help, "\n# TYPE ", metrics[k].name, " ", metrics[k].type, "\n");
      for (const auto& [name, m] : loaded) {
        const Batcher& b = *m->batcher;
        const PrefixCache* p = b.prefix_cache();
        const int64_t values[] = {b.queued(), b.running(), b.caches_in_use(), b.pages_in_use(), b.pages_total(),
                                  p ? p->hits() : 0, p ? p->reused_tokens() : 0, p ? p->bytes() : 0};
        out += cat(metrics[k].name, "{model=\"", name, "\"} ", values[k], "\n");
      }
    }
    const ModelCache::Stats st = cache_.stats();
    out += "# HELP loom_model_loaded Whether the model's weights are in memory\n# TYPE loom_model_loaded gauge\n";
    for (const std::string& name : cache_.names()) out += cat("loom_model_loaded{model=\"", name, "\"} ", loaded.contains(name), "\n");
    const std::tuple<const char*, const char*, uint64_t> counters[] = {
        {"loom_model_cache_hits_total", "Requests whose model was in memory", st.hits},
        {"loom_model_loads_total", "Models loaded (at start and on requests)", st.loads},
        {"loom_model_evictions_total", "Models evicted to make room under --memory-mb", st.evictions},
        {"loom_model_load_failures_total", "Model loads that failed", st.failures}};
    for (const auto& [name, help, v] : counters) out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name, " ", v, "\n");
    return out + cat("# HELP loom_model_memory_bytes Weights of the models in memory\n# TYPE loom_model_memory_bytes gauge\n",
                     "loom_model_memory_bytes ", st.bytes, "\n");
  }

  // A streaming response holds its handler thread until the sequence ends: one thread for
  // every place in each model's batch and queue (and some for the other endpoints and the
  // requests answered 429), at most 1024, so that the batches can fill.
  int handler_threads() const {
    return static_cast<int>(std::min<int64_t>(1024, static_cast<int64_t>(args_.models.size()) * (args_.max_batch + args_.queue) + 8));
  }

  http::Handlers handlers() {
    return {.head = [this](const http::Request& req) { return check_head(req); },
            .request = [this](const http::Request& req) { return handle(req); },
            .error = [this](int status, const std::string& message, const std::string& path) {
              return respond(endpoint_of(path), status,
                             json{{"error", {{"message", status == 413 ? body_limit() : message},
                                             {"type", status >= 500 ? "server_error" : "invalid_request_error"}}}});
            }};
  }

 private:
  static std::string endpoint_of(const std::string& path) {
    for (const char* known : {"/health", "/metrics", "/v1/models", "/v1/completions"})
      if (path == known) return path;
    return "other";
  }

  // Before any body is read: a request without the API key is answered 401, one whose
  // framing is ambiguous (Content-Length twice, or beside chunked: a smuggling risk behind a
  // proxy) 400. A Content-Length over the limit is the server's to refuse (413), right after
  // this, with the body_limit() text through the error handler.
  std::optional<http::Response> check_head(const http::Request& req) {
    const size_t lengths = req.count("Content-Length");
    const bool chunked = req.count("Transfer-Encoding") > 0;
    if (req.path == "/health" || (lengths == 0 && !chunked)) return std::nullopt;
    const std::string endpoint = endpoint_of(req.path);
    if (auto refused = unauthorized(req, endpoint)) return refused;
    auto refuse = [&](int status, const std::string& message) {
      return respond(endpoint, status, json{{"error", {{"message", message}, {"type", "invalid_request_error"}}}});
    };
    if (lengths > 1 || (lengths == 1 && chunked))
      return refuse(400, lengths > 1 ? "Content-Length given more than once" : "both Content-Length and Transfer-Encoding");
    if (chunked && (req.count("Transfer-Encoding") > 1 || req.field("Transfer-Encoding") != "chunked"))
      return refuse(400, "Transfer-Encoding: expected chunked");
    if (lengths == 1) {
      const std::string v = req.field("Content-Length");
      if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos)
        return refuse(400, "Content-Length: expected a non-negative integer");
    }
    return std::nullopt;
  }

  http::Response handle(const http::Request& req) {
    const std::string endpoint = endpoint_of(req.path);
    const bool get = req.method == "GET", post = req.method == "POST";
    if (endpoint == "other" || (endpoint == "/v1/completions" ? !post : !get)) {
      const std::string message = endpoint == "other" ? cat("no such endpoint: ", printable(req.path))
                                                      : cat(printable(req.method), " is not served on ", endpoint);
      return respond("other", endpoint == "other" ? 404 : 405,
                     json{{"error", {{"message", message}, {"type", "invalid_request_error"}}}});
    }
    if (endpoint == "/health") return respond(endpoint, 200, json{{"status", "ok"}});
    if (auto refused = unauthorized(req, endpoint)) return std::move(*refused);
    if (endpoint == "/metrics") {
      metrics_.count(endpoint, 200);
      return {.status = 200, .content_type = "text/plain; version=0.0.4", .body = metrics_.text() + gauges()};
    }
    if (endpoint == "/v1/models") {
      json data = json::array();
      for (const std::string& name : cache_.names())
        data.push_back({{"id", name}, {"object", "model"}, {"created", started_}, {"owned_by", "loom"}});
      for (const auto& [name, r] : routes_) {
        json to = json::object();
        for (const auto& [target, w] : r->targets()) to[target] = w;
        data.push_back({{"id", name}, {"object", "model"}, {"created", started_}, {"owned_by", "loom"}, {"routes_to", to}});
      }
      return respond(endpoint, 200, json{{"object", "list"}, {"data", data}});
    }
    try {  // /v1/completions; its body is within --max-body-kb (the server answered 413 past it)
      std::string served;  // the model, or the one a route picked for this request
      CompletionRequest c = parse_completion_request(
          req.body,
          [&](const std::string& name) {
            const auto route = routes_.find(name);
            served = route == routes_.end() ? name : route->second->pick();
            return cache_.has(served) ? ModelText{cache_.vocab_size(served), cache_.tokenizer(served)} : ModelText{-1, nullptr};
          },
          args_.max_tokens);
      return complete(cache_.get(served), std::move(c));
    } catch (const ModelUnavailable& u) {
      return respond(endpoint, u.status, json{{"error", {{"message", printable(u.what())}, {"type", "server_error"}}}});
    } catch (const Refusal& r) {
      return respond(endpoint, r.status,
                     json{{"error", {{"message", r.message}, {"type", r.status == 404 ? "not_found_error" : "invalid_request_error"}}}});
    } catch (const std::exception& e) {  // anything not expected: 500 with its line, logged, and the server goes on
      log_warn(cat("serve: ", endpoint, ": ", printable(e.what())));
      return respond(endpoint, 500, json{{"error", {{"message", printable(e.what())}, {"type", "server_error"}}}});
    }
  }

  // A byte model's output may be any bytes, and a JSON string must be UTF-8: bytes that do
  // not form UTF-8 go out as U+FFFD.
  static std::string utf8(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

  // The most a refused body is read (and dropped) to before its connection is cut.
  std::string body_limit() const { return cat("the body is over ", args_.max_body_kb, " KiB (--max-body-kb)"); }

  http::Response respond(const std::string& endpoint, int status, const json& body) {
    metrics_.count(endpoint, status);
    return {.status = status, .body = utf8(body)};
  }

  // With an API key, every endpoint but /health needs "Authorization: Bearer KEY", compared
  // in constant time: the 401 when it is missing or wrong.
  std::optional<http::Response> unauthorized(const http::Request& req, const std::string& endpoint) {
    if (args_.api_key.empty()) return std::nullopt;
    const std::string want = "Bearer " + args_.api_key, got = req.field("Authorization");
    if (got.size() == want.size() && CRYPTO_memcmp(got.data(), want.data(), want.size()) == 0) return std::nullopt;
    return respond(endpoint, 401, json{{"error", {{"message", "missing or wrong API key"}, {"type", "authentication_error"}}}});
  }

  // `model` is held until the response ends: the cache does not evict a model in use.
  http::Response complete(std::shared_ptr<Model> model, CompletionRequest c) {
    metrics_.prompt_tokens += c.generation.prompt.size();
    std::shared_ptr<Generation> g = model->batcher->submit(std::move(c.generation));
    if (!g)
      return respond("/v1/completions", 429,
                     json{{"error", {{"message", cat("model \"", model->name, "\" has ", args_.queue,
                                                      " requests waiting; try again later")},
                                     {"type", "rate_limit_error"}}}});
    const std::string id = cat("cmpl-", ++next_id_);
    const long created = static_cast<long>(std::time(nullptr));
    const std::string name = model->name;
    auto choice = [](const std::string& text, const json& finish) {
      return json{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
    };
    if (!c.stream) {
      std::string out;
      Generation::Event e;
      do out += (e = g->next()).piece;
      while (!e.done);
      const int64_t prompt = g->prompt_tokens(), made = g->completion_tokens();
      return respond("/v1/completions", 200,
                     json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", name},
                          {"choices", json::array({choice(out, e.finish)})},
                          {"usage", {{"prompt_tokens", prompt}, {"completion_tokens", made}, {"total_tokens", prompt + made}}}});
    }
    metrics_.count("/v1/completions", 200);
    auto chunk = [=](const std::string& piece, const json& finish) {
      return utf8(json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", name},
                       {"choices", json::array({choice(piece, finish)})}});
    };
    // Every event but the last is the same JSON around its piece: made once, with only the
    // piece written per token.
    const std::string empty = chunk("", nullptr);
    const size_t key = empty.find("\"text\":\"\"");  // the keys are in order, the others' values escaped
    LOOM_CHECK_LT(key, empty.size());
    const size_t text = key + 7;
    auto sse = [chunk, head = "data: " + empty.substr(0, text), tail = empty.substr(text + 2) + "\n\n"](
                   const Generation::Event& e) {
      if (e.done) return "data: " + chunk(e.piece, e.finish) + "\n\ndata: [DONE]\n\n";
      return head + utf8(e.piece) + tail;
    };
    // The batcher's delivery thread writes each event into the socket itself, as far as the
    // socket has room (no wake-up of this thread per token, and no wait for a client): when
    // it had no room for all of a write (the client reads slower than tokens come), this
    // thread writes what was left, and every later event, waiting for room up to 10 s.
    // Whatever becomes of the response (the stream ends, the client leaves, or the server
    // never gets to write it), the generation is cancelled once the response goes: a no-op
    // once it is done.
    struct CancelAtEnd {
      explicit CancelAtEnd(std::shared_ptr<Generation> generation) : g(std::move(generation)) {}
      CancelAtEnd(const CancelAtEnd&) = delete;
      ~CancelAtEnd() { g->cancel(); }
      std::shared_ptr<Generation> g;
    };
    auto cancel_at_end = std::make_shared<CancelAtEnd>(g);
    return {.status = 200,
            .content_type = "text/event-stream",
            .stream = [this, g, sse, model, cancel_at_end](http::Sink& sink) {
              // Set by the writer, read here only once next_all() returns (the writer has
              // let go by then: it is not called again).
              bool broken = false;  // a write failed: the client left
              std::string left;     // of the writer's last write, what found no room
              struct Detach {       // before this frame (and the sink) go, whatever happens
                Generation& g;
                ~Detach() { g.write_through(nullptr); }
              } detach{*g};
              auto write = [&](std::span<const Generation::Event> events) {
                std::string out;
                for (const Generation::Event& e : events) out += sse(e);
                std::optional<std::string> rest = sink.write_now(out);
                if (!rest) {
                  broken = true;
                  return Generation::Took::kNone;
                }
                if (rest->empty()) return Generation::Took::kAll;
                left = std::move(*rest);
                ++metrics_.slowed;
                return Generation::Took::kAllLast;
              };
              for (bool attached = false;;) {
                if (!attached) attached = g->write_through(write);  // once the events made so far are out
                std::string out;  // what waits goes out in one write
                bool end = false;
                for (const Generation::Event& e : g->next_all()) {
                  end = e.done;
                  if (e.written) break;
                  out += sse(e);
                }
                const bool sent = !broken && (left.empty() || sink.write_rest(std::exchange(left, {}))) &&
                                  (out.empty() || sink.write(out));
                if (!sent) {
                  g->cancel();  // the client left: its place and cache go to the others
                  return false;
                }
                if (end) return true;
              }
            }};
  }

  const ServerOptions& args_;
  long started_;
  int threads_;  // [job] threads: each model's compute threads, shared among its lanes
  int lanes_;    // decoding threads per model
  Metrics metrics_;  // before cache_: the batchers' threads write it until they end
  ModelCache cache_;
  std::map<std::string, std::unique_ptr<Route>> routes_;
  std::atomic<uint64_t> next_id_{0};
};


}  // namespace

sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

int run_completion_server(const ServerOptions& a, int64_t n_head, int threads, const sigset_t& stop_signals) {
  std::vector<ModelCache::Spec> specs;
  for (const std::string& spec : a.models) {
    const size_t eq = spec.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == spec.size())
      throw InputError(cat("--model ", printable(spec), ": expected NAME=PATH"));
    const std::string name = spec.substr(0, eq);
    for (const auto& s : specs)
      if (s.name == name) throw InputError(cat("--model ", printable(spec), ": the name ", name, " is given twice"));
    specs.push_back({name, spec.substr(eq + 1), ""});
  }
  for (const std::string& spec : a.tokenizers) {
    const size_t eq = spec.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == spec.size())
      throw InputError(cat("--tokenizer ", printable(spec), ": expected NAME=SPEC (e.g. gpt2=gpt2:DIR)"));
    const auto it = std::find_if(specs.begin(), specs.end(), [&](const auto& s) { return s.name == spec.substr(0, eq); });
    if (it == specs.end()) throw InputError(cat("--tokenizer ", printable(spec), ": no model named ", printable(spec.substr(0, eq)), " (--model NAME=PATH)"));
    it->tokenizer = spec.substr(eq + 1);
  }
  std::vector<std::unique_ptr<Route>> routes;
  for (const std::string& spec : a.routes) routes.push_back(std::make_unique<Route>(spec));
  CompletionServer server(a, specs, n_head, threads, std::move(routes));
  http::Server listener({.host = a.host,
                         .port = static_cast<int>(a.port),
                         .handler_threads = server.handler_threads(),
                         .max_connections = static_cast<int>(a.max_connections),
                         .max_body_bytes = static_cast<size_t>(a.max_body_kb) << 10},
                        server.handlers());
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    listener.stop();
  });
  std::printf("loom serve: listening on http://%s:%d (%zu model(s))\n", printable(a.host).c_str(), listener.port(),
              a.models.size());
  std::fflush(stdout);
  listener.run();
  pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  return 0;
}

}  // namespace loom::serve
