// `loom serve`: an OpenAI-style completions server over cpp-httplib (docs/serving.md).
// Every request decodes with its own key/value cache; the model's decode steps take turns
// under one lock (continuous batching is not built yet).
#include <httplib.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <span>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "infer.h"
#include "loom/bounded_json.h"
#include "loom/data.h"
#include "loom/error.h"
#include "loom/log.h"
#include "loom/rng.h"
#include "sampler.h"

namespace loom::app {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// `end`, less a UTF-8 character s[..end) ends in the middle of: a byte model emits one byte
// at a time, and a streamed piece must not split a character that the next bytes complete.
size_t whole_characters(const std::string& s, size_t end) {
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto b = static_cast<unsigned char>(s[end - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t length = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return length > back ? end - back : end;
  }
  return end;
}

// A request the server refuses: HTTP status and a message naming the field.
struct Refusal {
  int status;
  std::string message;
};

struct Model {
  std::string name, path;
  std::unique_ptr<nn::Gpt> gpt;
  std::mutex turn;  // one decode step at a time (each request has its own cache)
};

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
  std::atomic<int64_t> running{0};
  Histogram first_token{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram per_token{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};

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
               "# HELP loom_requests_running Completions being generated\n# TYPE loom_requests_running gauge\n",
               "loom_requests_running ", running.load(), "\n");
    out += first_token.text("loom_time_to_first_token_seconds", "From a completion's arrival to its first token");
    return out + per_token.text("loom_time_per_token_seconds", "Between a completion's consecutive tokens");
  }
};

// A completion request, validated: every field checked before any work.
struct Completion {
  Model* model = nullptr;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool text = true;  // a byte-level model: prompt and output are text, else token ids
};

Completion parse_completion(const std::string& body, std::map<std::string, std::unique_ptr<Model>>& models,
                            int64_t max_tokens_cap) {
  json j;
  try {
    j = parse_json_bounded(body, "the body", kRequestLimits);
  } catch (const InputError& e) {
    throw Refusal{400, e.what()};
  }
  if (!j.is_object()) throw Refusal{400, "the body must be a JSON object"};
  static const std::set<std::string> known = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop",
                                              "stream", "n", "user"};
  for (const auto& [key, value] : j.items())
    if (!known.contains(key)) throw Refusal{400, cat("unknown field \"", printable(key), "\"")};
  Completion c;
  if (!j.contains("model") || !j["model"].is_string()) throw Refusal{400, "\"model\": expected a model name (GET /v1/models)"};
  const auto m = models.find(j["model"].get<std::string>());
  if (m == models.end()) throw Refusal{404, cat("\"model\": no model named \"", printable(j["model"].get<std::string>()), "\"")};
  c.model = m->second.get();
  const nn::GptConfig& g = c.model->gpt->config();
  c.text = g.vocab_size <= 256;
  const json& p = j.contains("prompt") ? j["prompt"] : json("");
  if (p.is_string()) {
    if (!c.text)
      throw Refusal{400, cat("\"prompt\": model \"", c.model->name, "\" has a vocabulary of ", g.vocab_size,
                             " tokens and no tokenizer here; expected an array of token ids")};
    for (unsigned char ch : p.get<std::string>()) c.prompt.push_back(ch);
  } else if (p.is_array()) {
    for (const json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= g.vocab_size)
        throw Refusal{400, cat("\"prompt\": token ids must be integers in [0, ", g.vocab_size, ")")};
      c.prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    throw Refusal{400, "\"prompt\": expected a string or an array of token ids"};
  }
  if (c.prompt.empty()) c.prompt.push_back(c.text ? '\n' : static_cast<int32_t>(g.vocab_size - 1));
  auto number = [&](const char* key, double lo, double hi, double fallback) {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_number() || !(j[key].get<double>() >= lo && j[key].get<double>() <= hi))
      throw Refusal{400, cat("\"", key, "\": expected a number in [", lo, ", ", hi, "]")};
    return j[key].get<double>();
  };
  if (j.contains("max_tokens") && !j["max_tokens"].is_number_integer())
    throw Refusal{400, cat("\"max_tokens\": expected an integer in [0, ", max_tokens_cap, "]")};
  c.max_tokens = static_cast<int64_t>(number("max_tokens", 0, static_cast<double>(max_tokens_cap), 16));
  c.sampling.temperature = number("temperature", 0, 100, 1);
  c.sampling.top_p = number("top_p", 0, 1, 1);
  if (c.sampling.top_p == 0) throw Refusal{400, "\"top_p\": expected a number in (0, 1]"};
  if (j.contains("seed") && !j["seed"].is_number_integer()) throw Refusal{400, "\"seed\": expected an integer"};
  c.seed = j.contains("seed") ? j["seed"].get<uint64_t>() : static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  if (j.contains("n") && j["n"] != 1) throw Refusal{400, "\"n\": only 1 completion per request"};
  if (j.contains("stream") && !j["stream"].is_boolean()) throw Refusal{400, "\"stream\": expected true or false"};
  c.stream = j.value("stream", false);
  if (j.contains("stop") && !c.text) throw Refusal{400, "\"stop\": stop sequences are text; this model generates token ids"};
  if (j.contains("stop")) {
    const json& s = j["stop"];
    const json list = s.is_array() ? s : json::array({s});
    if (list.size() > 4) throw Refusal{400, "\"stop\": at most 4 sequences"};
    for (const json& x : list) {
      if (!x.is_string() || x.get<std::string>().empty()) throw Refusal{400, "\"stop\": expected non-empty strings"};
      c.stop.push_back(x.get<std::string>());
    }
  }
  return c;
}

class Server {
 public:
  Server(const ServeArgs& a, std::map<std::string, std::unique_ptr<Model>> models)
      : args_(a), models_(std::move(models)), started_(std::time(nullptr)) {}

  void routes(httplib::Server& http) {
    http.set_payload_max_length(1 << 20);
    http.set_read_timeout(10, 0);
    http.set_write_timeout(10, 0);
    http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
      respond(res, "/health", 200, json{{"status", "ok"}});
    });
    http.Get("/metrics", [&](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res, "/metrics")) return;
      metrics_.count("/metrics", 200);
      res.set_content(metrics_.text(), "text/plain; version=0.0.4");
    });
    http.Get("/v1/models", [&](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res, "/v1/models")) return;
      json data = json::array();
      for (const auto& [name, m] : models_)
        data.push_back({{"id", name}, {"object", "model"}, {"created", started_}, {"owned_by", "loom"}});
      respond(res, "/v1/models", 200, json{{"object", "list"}, {"data", data}});
    });
    http.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res, "/v1/completions")) return;
      try {
        complete(parse_completion(req.body, models_, args_.max_tokens), res);
      } catch (const Refusal& r) {
        respond(res, "/v1/completions", r.status,
                json{{"error", {{"message", r.message}, {"type", r.status == 404 ? "not_found_error" : "invalid_request_error"}}}});
      }
    });
    http.set_error_handler([&](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message = res.status == 413 ? "the body is over 1 MiB" : cat("no such endpoint: ", printable(req.path));
      res.set_content(json{{"error", {{"message", message}, {"type", "invalid_request_error"}}}}.dump(), "application/json");
      metrics_.count("other", res.status);
    });
  }

 private:
  // A byte model's output may be any bytes, and a JSON string must be UTF-8: bytes that do
  // not form UTF-8 go out as U+FFFD.
  static std::string utf8(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

  void respond(httplib::Response& res, const std::string& endpoint, int status, const json& body) {
    res.status = status;
    res.set_content(utf8(body), "application/json");
    metrics_.count(endpoint, status);
  }

  // With an API key, every endpoint but /health needs "Authorization: Bearer KEY", compared
  // in constant time.
  bool authorized(const httplib::Request& req, httplib::Response& res, const std::string& endpoint) {
    if (args_.api_key.empty()) return true;
    const std::string want = "Bearer " + args_.api_key, got = req.get_header_value("Authorization");
    if (got.size() == want.size() && CRYPTO_memcmp(got.data(), want.data(), want.size()) == 0) return true;
    respond(res, endpoint, 401, json{{"error", {{"message", "missing or wrong API key"}, {"type", "authentication_error"}}}});
    return false;
  }

  // Generates the completion, calling `emit(piece, done, finish_reason)` with the output as
  // it becomes final (text held back while it may still begin a stop sequence), until emit
  // returns false (the client left). Returns the prompt's and the completion's token counts.
  template <typename Emit>
  std::pair<int64_t, int64_t> generate(const Completion& c, Clock::time_point arrived, Emit&& emit) {
    const nn::Gpt& gpt = *c.model->gpt;
    const int64_t window = gpt.config().seq_len;
    nn::KvCache cache = gpt.make_cache();
    Arena arena;
    Sampler sampler(gpt.config().vocab_size);
    Rng rng(c.seed, /*stream=*/3);
    std::vector<int32_t> seq = c.prompt;
    std::string out;  // the completion so far (text, or ids separated by spaces)
    size_t sent = 0;
    metrics_.prompt_tokens += c.prompt.size();
    ++metrics_.running;
    Clock::time_point last = arrived;
    int64_t made = 0;
    std::string finish = "length";
    while (made < c.max_tokens) {
      int32_t token;
      {
        std::lock_guard lock(c.model->turn);
        // The prompt's last window first; past the window the cache starts again from the
        // last half window (docs/serving.md); otherwise one token.
        int64_t n = 1;
        if (cache.length == cache.capacity()) cache.length = 0, n = std::max<int64_t>(window / 2, 1);
        if (made == 0) n = std::min<int64_t>(static_cast<int64_t>(seq.size()), window);
        token = sampler.pick(gpt.decode(std::span<const int32_t>(seq).last(static_cast<size_t>(n)), cache, arena).data<float>(),
                             c.sampling, rng);
      }
      seq.push_back(token);
      ++made;
      ++metrics_.tokens;
      const Clock::time_point now = Clock::now();
      (made == 1 ? metrics_.first_token : metrics_.per_token).add(std::chrono::duration<double>(now - last).count());
      last = now;
      out += c.text ? std::string(1, static_cast<char>(token)) : cat(made > 1 ? " " : "", token);
      size_t ready = out.size();
      for (const std::string& s : c.stop) {
        if (out.ends_with(s)) {
          ready = out.size() - s.size();  // the stop sequence itself is not returned
          finish = "stop";
          break;
        }
        for (size_t k = std::min(s.size() - 1, out.size()); k > 0; --k)  // may still become s
          if (out.compare(out.size() - k, k, s, 0, k) == 0) {
            ready = std::min(ready, out.size() - k);
            break;
          }
      }
      if (c.text) ready = whole_characters(out, ready);
      const bool more = emit(out.substr(sent, ready - sent), false, "");
      sent = ready;
      if (finish == "stop") break;
      if (!more) {
        finish = "disconnected";
        break;
      }
    }
    --metrics_.running;
    emit(finish == "stop" ? std::string() : out.substr(sent), true, finish);
    return {static_cast<int64_t>(c.prompt.size()), made};
  }

  void complete(Completion c, httplib::Response& res) {
    const Clock::time_point arrived = Clock::now();
    const std::string id = cat("cmpl-", ++next_id_);
    const long created = static_cast<long>(std::time(nullptr));
    auto choice = [&](const std::string& text, const json& finish) {
      return json{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
    };
    if (!c.stream) {
      std::string out;
      std::string finish;
      const auto [prompt, made] = generate(c, arrived, [&](const std::string& piece, bool done, const std::string& why) {
        out += piece;
        if (done) finish = why;
        return true;
      });
      respond(res, "/v1/completions", 200,
              json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", c.model->name},
                   {"choices", json::array({choice(out, finish)})},
                   {"usage", {{"prompt_tokens", prompt}, {"completion_tokens", made}, {"total_tokens", prompt + made}}}});
      return;
    }
    metrics_.count("/v1/completions", 200);
    res.set_chunked_content_provider("text/event-stream", [this, c, arrived, id, created, choice](size_t, httplib::DataSink& sink) {
      generate(c, arrived, [&](const std::string& piece, bool done, const std::string& why) {
        const json chunk{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", c.model->name},
                         {"choices", json::array({choice(piece, done ? json(why) : json(nullptr))})}};
        std::string event = "data: " + utf8(chunk) + "\n\n";
        if (done) event += "data: [DONE]\n\n";
        return sink.is_writable() && sink.write(event.data(), event.size());
      });
      sink.done();
      return true;
    });
  }

  const ServeArgs& args_;
  std::map<std::string, std::unique_ptr<Model>> models_;
  long started_;
  Metrics metrics_;
  std::atomic<uint64_t> next_id_{0};
};

bool loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

}  // namespace

int run_serve(const ServeArgs& a) {
  if (a.models.empty()) throw InputError("serve: expected at least one --model NAME=PATH");
  if (a.port < 0 || a.port > 65535) throw InputError(cat("--port ", a.port, ": expected 0 (any free port) to 65535"));
  if (a.max_tokens < 1) throw InputError(cat("--max-tokens ", a.max_tokens, ": expected a positive integer"));
  std::string key = a.api_key;
  if (key.empty() && std::getenv("LOOM_API_KEY") != nullptr) key = std::getenv("LOOM_API_KEY");
  if (!loopback(a.host) && key.empty())
    throw InputError(cat("--host ", printable(a.host), ": a server reachable from other hosts needs an API key "
                         "(--api-key KEY or LOOM_API_KEY)"));
  const Config c = inference_config(a.config, a.overrides);
  std::map<std::string, std::unique_ptr<Model>> models;
  for (const std::string& spec : a.models) {
    const size_t eq = spec.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == spec.size())
      throw InputError(cat("--model ", printable(spec), ": expected NAME=PATH"));
    auto m = std::make_unique<Model>();
    m->name = spec.substr(0, eq);
    m->path = spec.substr(eq + 1);
    if (models.contains(m->name)) throw InputError(cat("--model ", printable(spec), ": the name ", m->name, " is given twice"));
    m->gpt = load_gpt(checkpoint::Checkpoint::open(m->path), c);
    models[m->name] = std::move(m);
  }
  ServeArgs args = a;
  args.api_key = key;
  Server server(args, std::move(models));
  httplib::Server http;
  server.routes(http);
  // SIGINT and SIGTERM stop the server from a thread that waits for them (a handler may not
  // call into the server).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const int port = a.port == 0 ? http.bind_to_any_port(a.host) : (http.bind_to_port(a.host, a.port) ? a.port : -1);
  if (port < 0) throw RuntimeError(cat("serve: cannot listen on ", printable(a.host), ":", a.port));
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    http.stop();
  });
  std::printf("loom serve: listening on http://%s:%d (%zu model(s))\n", a.host.c_str(), port, a.models.size());
  std::fflush(stdout);
  const bool ok = http.listen_after_bind();
  pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  if (!ok) throw RuntimeError(cat("serve: the server on ", printable(a.host), ":", port, " stopped with an error"));
  return 0;
}

}  // namespace loom::app
