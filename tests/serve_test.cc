// `loom serve` as a user meets it: a server process on loopback, an HTTP client.
// Completions are reproducible by seed, streamed or not, stop where asked, and every bad
// request gets its status and a line naming the field; the server keeps serving.
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "loom/nn/gpt.h"
#include "serve_fixture.h"

namespace loom {
namespace {

TEST_F(Serve, CompletionsAreReproducibleStreamedOrNotAndStopWhereAsked) {
  start({"--model", cat("nano=", p("runs/n")), "--lanes", "1", "--job.threads=2"});
  auto c = client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "nano");

  const json request = {{"model", "nano"}, {"prompt", "The quick "}, {"max_tokens", 24}, {"seed", 7}, {"temperature", 0.8}};
  const auto [status, first] = complete(request);
  ASSERT_EQ(status, 200) << first.dump();
  const std::string text = first["choices"][0]["text"];
  EXPECT_EQ(first["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(first["usage"]["completion_tokens"], 24);
  EXPECT_EQ(first["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(complete(request).second["choices"][0]["text"], text) << "the same seed, the same completion";

  // Streamed: server-sent events whose pieces make the same text, then [DONE].
  json streamed = request;
  streamed["stream"] = true;
  auto r = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::string joined, finish;
  std::istringstream events(r->body);
  bool done = false;
  for (std::string line; std::getline(events, line);) {
    if (!line.starts_with("data: ")) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    const json chunk = json::parse(line.substr(6));
    joined += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(joined, text);
  EXPECT_EQ(finish, "length");

  // A stop sequence taken from the text: the completion ends before its first occurrence.
  const size_t at = text.find_first_of("abcdefghijklmnopqrstuvwxyz", 1);
  ASSERT_NE(at, std::string::npos) << text;
  const std::string stop = text.substr(at, 1);
  json stopping = request;
  stopping["stop"] = json::array({stop, "never appears"});
  const auto [stop_status, stopped] = complete(stopping);
  ASSERT_EQ(stop_status, 200) << stopped.dump();
  EXPECT_EQ(stopped["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  stopping["stream"] = true;  // streamed, the held-back text is the same
  r = c.Post("/v1/completions", stopping.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("\"finish_reason\":\"stop\""), std::string::npos) << r->body;

  // Several clients at once: each gets what it gets alone.
  std::vector<std::string> got(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] {
      json q = request;
      q["seed"] = i;
      got[i] = complete(q).second["choices"][0]["text"];
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < 4; ++i) {
    json q = request;
    q["seed"] = i;
    EXPECT_EQ(complete(q).second["choices"][0]["text"], got[i]) << "client " << i;
  }

  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("loom_requests_total{endpoint=\"/v1/completions\",code=\"200\"} 13"), std::string::npos)
      << metrics->body;
  for (const char* gauge : {"loom_requests_running{model=\"nano\"} 0", "loom_queue_depth{model=\"nano\"} 0"})
    EXPECT_NE(metrics->body.find(gauge), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("loom_batch_sequences_count"), std::string::npos) << metrics->body;
  if (std::filesystem::exists("/usr/bin/promtool")) {  // Prometheus's own lint (scripts/setup.sh installs it)
    write(p("exposition.txt"), metrics->body);
    const testing::CommandResult lint = testing::run_command(cat("/usr/bin/promtool check metrics < ", p("exposition.txt"), " 2>&1"));
    EXPECT_EQ(lint.code, 0) << lint.out;
    EXPECT_EQ(lint.out, "") << lint.out;
  }
  EXPECT_NE(metrics->body.find("loom_time_to_first_token_seconds_count 13"), std::string::npos) << metrics->body;
  // Every request after the first shares its 10-token prompt: each copies in the first 9
  // positions' keys and values (the prefix cache) and reads only the last.
  for (const char* line : {"loom_prefix_cache_hits_total{model=\"nano\"} 12\n",
                           "loom_prefix_cache_tokens_total{model=\"nano\"} 108\n"})
    EXPECT_NE(metrics->body.find(line), std::string::npos) << line << "\n" << metrics->body;
}

std::string raw_exchange(int port, const std::string& head, const std::string& body);

TEST_F(Serve, BadRequestsGetTheirStatusNamingTheField) {
  start({"--model", cat("nano=", p("runs/n")), "--api-key", "s3cret", "--max-tokens", "100"});
  const httplib::Headers key = {{"Authorization", "Bearer s3cret"}};
  for (const auto& [body, status, says] : std::vector<std::tuple<std::string, int, std::string>>{
           {"{\"model\": \"nano\"", 400, "the body"},
           {R"({"model": "nano", "prompt": [[[[1]]]]})", 400, "nested"},
           {"[1, 2]", 400, "JSON object"},
           {R"({"model": "other"})", 404, "no model named"},
           {R"({"prompt": "x"})", 400, "model"},
           {R"({"model": "nano", "max_tokens": -1})", 400, "max_tokens"},
           {R"({"model": "nano", "max_tokens": 101})", 400, "[0, 100]"},
           {R"({"model": "nano", "max_tokens": 1e300})", 400, "max_tokens"},
           {R"({"model": "nano", "temperature": "hot"})", 400, "temperature"},
           {R"({"model": "nano", "top_p": 0})", 400, "top_p"},
           {R"({"model": "nano", "prompt": [1, 999]})", 400, "token ids"},
           {R"({"model": "nano", "stop": [""]})", 400, "stop"},
           {R"({"model": "nano", "stream": "yes"})", 400, "stream"},
           {R"({"model": "nano", "echo": true})", 400, "unknown field"},
       }) {
    auto r = client().Post("/v1/completions", key, body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    const json error = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error.contains("error")) << body << " -> " << r->body;
    EXPECT_NE(error["error"]["message"].get<std::string>().find(says), std::string::npos) << body << " -> " << r->body;
  }
  // Without the key (or with another of the same length): 401; /health needs none.
  EXPECT_EQ(complete({{"model", "nano"}}).first, 401);
  EXPECT_EQ(complete({{"model", "nano"}}, {{"Authorization", "Bearer s3creT"}}).first, 401);
  EXPECT_EQ(client().Get("/health")->status, 200);
  EXPECT_EQ(client().Get("/v1/models")->status, 401);
  // A body over 1 MiB: 413 at once, before it is read (the connection closed after).
  EXPECT_EQ(raw_exchange(port_, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
                                "Content-Length: 2097152\r\n\r\n",
                         std::string(2 << 20, ' ')),
            "HTTP/1.1 413 Payload Too Large");
  // Still serving.
  EXPECT_EQ(complete({{"model", "nano"}, {"max_tokens", 3}}, key).first, 200);
}

// Continuous batching's bounds: with one place in the batch and one in the queue, a third
// request is refused with 429 at once; a streaming client that leaves frees its place and
// cache for the waiting request, and nothing stays held.
TEST_F(Serve, AFullQueueAnswers429AndALeavingClientFreesItsPlace) {
  start({"--model", cat("nano=", p("runs/n")), "--max-batch", "1", "--queue", "1"});
  auto gauge = [&](const std::string& name) {
    const std::string body = client().Get("/metrics")->body, key = name + "{model=\"nano\"} ";
    const size_t at = body.find(key);
    return at == std::string::npos ? -1 : std::stoi(body.substr(at + key.size()));
  };
  auto wait_for = [&](const std::string& name, int value) {
    for (int i = 0; i < 400 && gauge(name) != value; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return gauge(name) == value;
  };
  std::mutex mu;
  std::condition_variable cv;
  bool leave = false;
  int chunks = 0;
  std::thread streaming([&] {  // holds the batch's place until told to leave
    const json q = {{"model", "nano"}, {"max_tokens", 4000}, {"stream", true}, {"seed", 1}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = q.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      std::unique_lock lock(mu);
      ++chunks;
      cv.wait(lock, [&] { return leave; });
      return false;  // the client goes away mid-stream
    };
    httplib::Response res;
    httplib::Error error;
    client().send(req, res, error);
  });
  ASSERT_TRUE(wait_for("loom_requests_running", 1));
  std::pair<int, json> queued;
  std::thread waiting([&] { queued = complete({{"model", "nano"}, {"max_tokens", 20}, {"seed", 2}}); });
  ASSERT_TRUE(wait_for("loom_queue_depth", 1));
  const auto refused = complete({{"model", "nano"}, {"max_tokens", 5}});
  EXPECT_EQ(refused.first, 429) << refused.second.dump();
  {
    std::lock_guard lock(mu);
    leave = true;
  }
  cv.notify_all();
  streaming.join();
  waiting.join();
  EXPECT_EQ(queued.first, 200) << queued.second.dump();
  EXPECT_EQ(queued.second["usage"]["completion_tokens"], 20);
  EXPECT_TRUE(wait_for("loom_requests_running", 0));
  EXPECT_EQ(gauge("loom_queue_depth"), 0);
  EXPECT_EQ(gauge("loom_kv_caches_in_use"), 0) << "a cache held after its request ended";
  EXPECT_EQ(gauge("loom_kv_pages_in_use"), 0) << "pages held after their request ended";
}

// Models, memory and routes (docs/serving.md): under --memory-mb that holds one nano model,
// only the first loads at start; a route sends exactly 3 of every 4 requests to a and 1 to
// b, each switch evicting the other (least recently used, idle); a model whose weights were
// corrupted after start fails its request with 503 naming it, and the others go on.
TEST_F(Serve, ModelsLoadOnDemandAreEvictedLeastRecentlyUsedAndRoutesSplitByWeight) {
  namespace fs = std::filesystem;
  for (const char* copy : {"b", "c"}) fs::copy(p("runs/n/checkpoints"), p(copy), fs::copy_options::recursive);
  start({"--model", cat("a=", p("runs/n")), "--model", cat("b=", p("b")), "--model", cat("c=", p("c")), "--memory-mb",
         "0.6", "--route", "canary=a:3,b:1"});
  auto metric = [&](const std::string& key) {
    const std::string body = client().Get("/metrics")->body;
    const size_t at = body.find("\n" + key + " ");
    return at == std::string::npos ? -1 : std::stoll(body.substr(at + key.size() + 2));
  };
  EXPECT_EQ(metric("loom_model_loaded{model=\"a\"}"), 1);
  EXPECT_EQ(metric("loom_model_loaded{model=\"b\"}"), 0);
  EXPECT_EQ(metric("loom_model_loaded{model=\"c\"}"), 0);
  const json models = json::parse(client().Get("/v1/models")->body);
  EXPECT_EQ(models["data"][3]["id"], "canary") << models.dump();
  EXPECT_EQ(models["data"][3]["routes_to"], json({{"a", 3}, {"b", 1}})) << models.dump();
  std::string order;
  for (int i = 0; i < 8; ++i) {
    const auto [status, body] = complete({{"model", "canary"}, {"max_tokens", 2}, {"seed", i}});
    ASSERT_EQ(status, 200) << body.dump();
    order += body["model"].get<std::string>();
  }
  EXPECT_EQ(order, "aabaaaba");  // smooth weighted round robin: 6 a, 2 b, spread out
  EXPECT_EQ(metric("loom_model_evictions_total"), 4);  // a -> b -> a, twice
  EXPECT_EQ(metric("loom_model_loads_total"), 5);
  EXPECT_EQ(metric("loom_model_cache_hits_total"), 4);
  // c's weights, corrupted after the server checked its index at start.
  const std::string step = p(cat("c/", read_file(p("c/latest")).substr(0, read_file(p("c/latest")).find('\n'))));
  std::string bytes = read_file(step + "/model-00000.safetensors");
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 1);
  write(step + "/model-00000.safetensors", bytes);
  const auto [bad, why] = complete({{"model", "c"}, {"max_tokens", 2}});
  EXPECT_EQ(bad, 503) << why.dump();
  EXPECT_NE(why.dump().find("model \\\"c\\\" failed to load"), std::string::npos) << why.dump();
  EXPECT_NE(why.dump().find("SHA-256"), std::string::npos) << why.dump();
  EXPECT_EQ(complete({{"model", "a"}, {"max_tokens", 2}}).first, 200);
  EXPECT_EQ(metric("loom_model_load_failures_total"), 1);
  // Requests for a and b at once, from 4 clients: each is served (200) or finds no room
  // while the other model serves (503); the budget holds whatever the interleaving.
  std::vector<std::thread> clients;
  std::atomic<int> odd{0};
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      for (int i = 0; i < 6; ++i) {
        const int status = complete({{"model", (t + i) % 2 ? "a" : "b"}, {"max_tokens", 3}, {"seed", i}}).first;
        if (status != 200 && status != 503) ++odd;
      }
    });
  for (auto& c : clients) c.join();
  EXPECT_EQ(odd, 0);
  EXPECT_LE(metric("loom_model_memory_bytes"), static_cast<int64_t>(0.6 * (1 << 20)));
  EXPECT_EQ(complete({{"model", "b"}, {"max_tokens", 2}}).first, 200);
}

// An int8 checkpoint (loom quantize) and an f32 one quantized at load (--quantize int8)
// compute with the same int8 weights: the same completions, a quarter of the memory.
TEST_F(Serve, ServesInt8WeightsFromAQuantizedCheckpointOrQuantizedAtLoad) {
  const Result q = loom(cat("quantize --checkpoint ", p("runs/n"), " --out ", p("q8")));
  ASSERT_EQ(q.code, 0) << q.err;
  start({"--model", cat("q8=", p("q8")), "--model", cat("f=", p("runs/n")), "--quantize", "int8"});
  json request = {{"prompt", "The quick "}, {"max_tokens", 24}, {"seed", 7}, {"temperature", 0.8}};
  request["model"] = "q8";
  const auto [s1, a] = complete(request);
  request["model"] = "f";
  const auto [s2, b] = complete(request);
  ASSERT_EQ(s1, 200) << a.dump();
  ASSERT_EQ(s2, 200) << b.dump();
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  const std::string body = client().Get("/metrics")->body;
  const size_t at = body.find("\nloom_model_memory_bytes ");
  ASSERT_NE(at, std::string::npos) << body;
  const double f32_bytes = 4.0 * static_cast<double>(nn::gpt_counts({.n_layer = 2, .n_head = 2, .d_model = 64,
                                                                      .seq_len = 64, .vocab_size = 256}).total());
  EXPECT_LT(std::stod(body.substr(at + 25)), 2 * f32_bytes / 3.5) << "two models at int8";
}

// Keys and values in bf16: a megabyte holds twice the pages (nano: 16 KiB a page in f32,
// 64 of them; 128 in bf16), and completions stay reproducible, alone or side by side.
TEST_F(Serve, Bf16KeyValueCachesHoldTwiceThePagesAndServeReproducibly) {
  start({"--model", cat("nano=", p("runs/n")), "--kv-cache-dtype", "bf16", "--kv-cache-mb", "1", "--max-batch", "32"});
  const std::string body = client().Get("/metrics")->body;
  EXPECT_NE(body.find("loom_kv_pages_capacity{model=\"nano\"} 128\n"), std::string::npos) << body;
  std::vector<std::string> got(4);
  std::vector<std::thread> clients;
  const auto request = [](int i) {
    return json{{"model", "nano"}, {"prompt", "The quick "}, {"max_tokens", 30}, {"seed", i}, {"temperature", 0.8}};
  };
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] { got[i] = complete(request(i)).second["choices"][0]["text"]; });
  for (auto& t : clients) t.join();
  for (int i = 0; i < 4; ++i) {
    const auto [status, alone] = complete(request(i));
    ASSERT_EQ(status, 200) << alone.dump();
    EXPECT_EQ(alone["choices"][0]["text"], got[i]) << "client " << i;
  }
}

TEST_F(Serve, BadServerArgumentsAreRefusedAtStart) {
  const std::string model = cat(" --model nano=", p("runs/n"));
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {model + " --host 0.0.0.0", "needs an API key"},
           {" --model nano", "expected NAME=PATH"},
           {model + model, "given twice"},
           {cat(" --model x=", p("nowhere")), "nowhere"},
           {model + " --port 70000", "--port 70000"},
           {model + " --route canary=nano:0", "--route canary=nano:0: expected NAME=MODEL:WEIGHT"},
           {model + " --route canary=other:1", "no model named other"},
           {model + " --route nano=nano:1", "the name is a model's"},
           {model + " --memory-mb -1", "--memory-mb -1"},
           {model + " --quantize fp8", "--quantize fp8: expected none or int8"},
           {model + " --lanes -1", "--lanes -1: expected 0 ([job] threads) to 256"},
           {model + " --events-nice 20", "--events-nice 20: expected 0 to 19"},
           {model + " --prefix-cache-mb -1", "--prefix-cache-mb -1: expected 0 (none kept) to 1048576"},
           {model + " --kv-cache-dtype f16", "--kv-cache-dtype f16: expected f32 or bf16"},
           {model + " --max-body-kb 0", "--max-body-kb = 0: expected an integer in [1, 65536]"},
       }) {
    const Result r = loom("serve" + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << "\n" << r.err;
  }
}

// Sends `head` (and then `body`, in 64 KiB writes, while the server reads) on a fresh
// connection and returns the status line of the answer ("" when none came within 5 s).
std::string raw_exchange(int port, const std::string& head, const std::string& body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "connect failed";
  timeval tv{.tv_sec = 5, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  for (size_t at = 0; at < body.size(); at += 65536)  // stops mattering once the server has closed
    if (::send(fd, body.data() + at, std::min<size_t>(65536, body.size() - at), MSG_NOSIGNAL) < 0) break;
  std::string got;
  char buf[4096];
  for (ssize_t n; got.find("\r\n") == std::string::npos && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, n);
  ::close(fd);
  return got.substr(0, got.find("\r\n"));
}

// The server's peak resident memory (VmHWM), in bytes.
int64_t peak_rss_of(pid_t pid) {
  std::istringstream in(slurp_proc(cat("/proc/", pid, "/status")));
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// Bodies are bounded before memory is taken (issue 46, item 4): a Content-Length over
// --max-body-kb is answered 413 without the body being sent; a chunked body 413 as soon as
// it crosses the limit (64 MiB sent, the server's peak memory up by far less); without the
// API key, 401 before any body is read; Content-Length twice, or beside chunked, 400.
TEST_F(Serve, BodiesAreBoundedBeforeMemoryIsTakenAndFramingIsUnambiguous) {
  start({"--model", cat("nano=", p("runs/n")), "--max-body-kb", "64", "--api-key", "k"});
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  const std::string key = "Authorization: Bearer k\r\n";
  EXPECT_EQ(raw_exchange(port_, post + key + "Content-Length: 67108864\r\n\r\n", ""), "HTTP/1.1 413 Payload Too Large");
  EXPECT_EQ(raw_exchange(port_, post + "Content-Length: 67108864\r\n\r\n", ""), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(raw_exchange(port_, post + "Transfer-Encoding: chunked\r\n\r\n", ""), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(raw_exchange(port_, post + key + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", ""), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(raw_exchange(port_, post + key + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", ""),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(raw_exchange(port_, post + key + "Content-Length: -1\r\n\r\n", ""), "HTTP/1.1 400 Bad Request");
  // A head over its limits (16 KiB, 100 fields): 431; another method on a path, or another path.
  std::string fields;
  for (int i = 0; i < 101; ++i) fields += cat("X-", i, ": y\r\n");
  EXPECT_EQ(raw_exchange(port_, post + key + fields + "\r\n", ""), "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(raw_exchange(port_, post + "X-Long: " + std::string(20000, 'y') + "\r\n\r\n", ""),
            "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(raw_exchange(port_, "GET /v1/completions HTTP/1.1\r\nHost: x\r\n" + key + "\r\n", ""),
            "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(raw_exchange(port_, "GET /nope HTTP/1.0\r\n\r\n", ""), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(raw_exchange(port_, "NOT HTTP\r\n\r\n", ""), "HTTP/1.1 400 Bad Request");
  const int64_t before = peak_rss_of(pid_);
  std::string chunked;
  const std::string piece(65536 - 16, 'x');
  for (int i = 0; i < 1024; ++i) chunked += cat(std::hex, piece.size(), "\r\n", piece, "\r\n");
  chunked += "0\r\n\r\n";
  EXPECT_EQ(raw_exchange(port_, post + key + "Transfer-Encoding: chunked\r\n\r\n", chunked), "HTTP/1.1 413 Payload Too Large");
  EXPECT_LT(peak_rss_of(pid_) - before, int64_t{16} << 20) << "a refused 64 MiB body raised the server's peak memory";
  // A body a little over the limit is read on and dropped: a client still sending it gets
  // its 413, not a reset connection.
  httplib::Headers with_key = {{"Authorization", "Bearer k"}};
  for (const bool chunked : {false, true}) {
    const std::string over(3 << 20, ' ');  // more than loopback buffers hold
    auto r = chunked ? client().Post("/v1/completions", with_key,
                                     [&](size_t offset, httplib::DataSink& sink) {
                                       if (offset == over.size()) sink.done();
                                       else sink.write(over.data() + offset, std::min<size_t>(over.size() - offset, 4096));
                                       return true;
                                     },
                                     "application/json")
                     : client().Post("/v1/completions", with_key, over, "application/json");
    ASSERT_TRUE(r) << (chunked ? "chunked" : "with a length") << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 413) << r->body;
    EXPECT_NE(r->body.find("--max-body-kb"), std::string::npos) << r->body;
  }
  // A body within the limit is served as before.
  const auto [status, body] = complete({{"model", "nano"}, {"prompt", "The"}, {"max_tokens", 2}},
                                       {{"Authorization", "Bearer k"}});
  EXPECT_EQ(status, 200) << body;
}

}  // namespace
}  // namespace loom
