// `loom bench serve`: streaming clients against a running `loom serve`, each a thread with
// its own connection asking for one completion after another; throughput and latencies as
// the clients see them (time to the first event, time between events). The load generator
// is C++ so that on a small machine the clients take little of the CPU the server is
// measured on (docs/perf.md). Benchmarks, never timed tests.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "loom/bench/bench.h"
#include "loom/core/error.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

struct Latencies {
  std::mutex mu;
  std::vector<double> first, gaps;  // seconds
  int64_t events = 0;
  std::string error;  // the first failure, if any
};

// One streamed completion; its events' arrival times go to `out`.
void one_request(httplib::Client& client, const std::string& body, Latencies& out) {
  std::vector<Clock::time_point> arrivals;
  std::string buffer;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const Clock::time_point now = Clock::now();
    buffer.append(data, n);
    for (size_t at; (at = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, at + 2))
      if (buffer.starts_with("data: {")) arrivals.push_back(now);
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const Clock::time_point start = Clock::now();
  const bool sent = client.send(req, res, error);
  std::lock_guard lock(out.mu);
  if (!sent || res.status != 200) {
    if (out.error.empty())
      out.error = sent ? cat("HTTP ", res.status, ": ", res.body) : cat("request failed: ", httplib::to_string(error));
    return;
  }
  for (size_t i = 0; i < arrivals.size(); ++i)
    (i == 0 ? out.first : out.gaps).push_back(seconds(i == 0 ? start : arrivals[i - 1], arrivals[i]));
  out.events += static_cast<int64_t>(arrivals.size());
}

}  // namespace

int run_bench_serve(const BenchServeArgs& a) {
  if (a.port < 1 || a.port > 65535) throw InputError(cat("--port ", a.port, ": expected the port of a running loom serve"));
  for (int64_t c : a.clients)
    if (c < 1 || c > 4096) throw InputError(cat("--clients ", c, ": expected 1 to 4096"));
  check_flag_range("--requests", a.requests, 1, 1 << 20);
  check_flag_range("--tokens", a.tokens, 1, 1 << 20);
  if (!(a.temperature >= 0 && a.temperature <= 100))  // what loom serve accepts
    throw InputError(cat("--temperature = ", a.temperature, ": expected a number in [0, 100]"));
  {
    httplib::Client probe(a.host, a.port);
    const httplib::Result r = probe.Get("/health");
    if (!r || r->status != 200)
      throw RuntimeError(cat("bench serve: no loom serve answers on ", a.host, ":", a.port, " (GET /health)"));
  }
  std::printf("# loom bench serve: %s:%d, model %s, %lld tokens per request, %lld requests per client, temperature %g, %s\n",
              a.host.c_str(), a.port, a.model.c_str(), static_cast<long long>(a.tokens), static_cast<long long>(a.requests),
              a.temperature, a.keep_alive ? "one connection per client" : "a connection per request");
  std::printf("%8s %10s %8s %12s %12s %13s %13s\n", "clients", "tokens/s", "vs first", "ttft p50 ms", "ttft p99 ms",
              "token p50 ms", "token p99 ms");
  double base = 0;
  for (int64_t clients : a.clients) {
    Latencies lat;
    std::vector<std::thread> threads;
    const Clock::time_point t0 = Clock::now();
    for (int64_t i = 0; i < clients; ++i)
      threads.emplace_back([&, i] {
        httplib::Client client(a.host, a.port);
        client.set_read_timeout(120);
        client.set_keep_alive(a.keep_alive);
        client.set_tcp_nodelay(a.keep_alive);
        for (int64_t k = 0; k < a.requests; ++k) {
          const json body{{"model", a.model},          {"prompt", a.prompt},           {"max_tokens", a.tokens},
                          {"seed", 1000 * i + k},      {"temperature", a.temperature}, {"stream", true}};
          one_request(client, body.dump(), lat);
        }
      });
    for (std::thread& t : threads) t.join();
    const double wall = seconds(t0, Clock::now());
    if (!lat.error.empty()) throw RuntimeError(cat("bench serve: ", clients, " clients: ", lat.error));
    // Each event carries one token's text (a byte model) or holds some back (a stop
    // sequence, a split character): tokens are what the requests asked for.
    const double rate = static_cast<double>(clients * a.requests * a.tokens) / wall;
    if (base == 0) base = rate;
    std::printf("%8lld %10.0f %7.2fx %12.1f %12.1f %13.2f %13.2f\n", static_cast<long long>(clients), rate, rate / base,
                percentile(lat.first, 0.5) * 1e3, percentile(lat.first, 0.99) * 1e3, percentile(lat.gaps, 0.5) * 1e3,
                percentile(lat.gaps, 0.99) * 1e3);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::bench
