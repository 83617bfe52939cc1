// `loom serve` under load and abuse (docs/serving.md, "Load and bad input"): 64 streaming
// clients at once, clients that leave mid-stream, bad requests of every kind and stalled
// (slow-loris) connections, all together. Every good client gets what it gets alone, every
// bad request its status at once, a stalled request is answered 408 at the head timeout,
// nothing stays held (through /metrics) and the server goes on.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "serve_fixture.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

// The text of a streamed completion (its `data:` events put together), or "" with the status.
std::pair<int, std::string> stream(httplib::Client& c, const json& body, int leave_after = -1) {
  std::string text, buffer;
  int events = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    for (size_t at; (at = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, at + 2)) {
      const std::string event = buffer.substr(0, at);
      if (event.starts_with("data: {")) text += json::parse(event.substr(6))["choices"][0]["text"].get<std::string>();
      ++events;
    }
    return leave_after < 0 || events < leave_after;  // false: the client goes away
  };
  httplib::Response res;
  httplib::Error error;
  const auto t0 = Clock::now();
  if (!c.send(req, res, error))
    return {-1, cat(httplib::to_string(error), " after ", std::chrono::duration<double>(Clock::now() - t0).count(), " s, ",
                    events, " events: ", text)};
  return {res.status, text};
}

// A connection that sends half a request and then nothing; returns the seconds until the
// server answered it (408) or closed it (or `limit` when it did neither).
double stalled_connection(int port, double limit) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  const std::string half = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le";
  (void)!::write(fd, half.data(), half.size());
  const auto t0 = Clock::now();
  timeval tv{.tv_sec = 0, .tv_usec = 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char byte;
  double waited = 0;
  while ((waited = std::chrono::duration<double>(Clock::now() - t0).count()) < limit) {
    const ssize_t n = ::read(fd, &byte, 1);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;  // answered or closed
  }
  ::close(fd);
  return waited;
}

TEST_F(Serve, UnderLoadAndAbuseEveryClientGetsItsAnswerAndNothingLeaks) {
  start({"--model", cat("nano=", p("runs/n")), "--max-batch", "16", "--queue", "64", "--lanes", "3"});
  constexpr int kClients = 64, kLeavers = 8;
  auto body = [](int seed, bool streamed) {
    return json{{"model", "nano"}, {"prompt", "Q: "}, {"max_tokens", 24}, {"seed", seed}, {"temperature", 0.9},
                {"stream", streamed}};
  };
  std::vector<std::pair<int, std::string>> got(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = client();
      got[i] = stream(c, body(100 + i, true));
    });
  for (int i = 0; i < kLeavers; ++i)  // leave after two events, mid-stream
    threads.emplace_back([&, i] {
      auto c = client();
      stream(c, body(500 + i, true), 2);
    });
  double stalled[2] = {0, 0};
  for (double& s : stalled) threads.emplace_back([&] { s = stalled_connection(port_, 15.0); });

  // Bad requests while all that runs: each answered at once with its status.
  const std::string big(1 << 20, ' ');
  const std::vector<std::tuple<std::string, std::string, int>> bad = {
      {"not JSON", "{\"model\": ", 400},
      {"oversized", "{\"model\": \"nano\", \"prompt\": \"" + big + "\"}", 413},
      {"unknown model", json{{"model", "nope"}}.dump(), 404},
      {"negative max_tokens", json{{"model", "nano"}, {"max_tokens", -1}}.dump(), 400},
      {"huge max_tokens", json{{"model", "nano"}, {"max_tokens", 1e12}}.dump(), 400},
      {"a string for a number", json{{"model", "nano"}, {"max_tokens", "9"}}.dump(), 400},
      {"not an object", "[1, 2]", 400}};
  std::vector<double> ms;
  for (int round = 0; round < 3; ++round)
    for (const auto& [what, text, status] : bad) {
      const auto t0 = Clock::now();
      auto r = client().Post("/v1/completions", text, "application/json");
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      ASSERT_TRUE(r) << what;
      EXPECT_EQ(r->status, status) << what << ": " << r->body;
    }
  for (auto& t : threads) t.join();

  std::sort(ms.begin(), ms.end());
  std::printf("bad requests under load: p50 %.1f ms, max %.1f ms; stalled requests answered after %.1f and %.1f s\n",
              ms[ms.size() / 2], ms.back(), stalled[0], stalled[1]);
  EXPECT_LT(ms[ms.size() / 2], 100.0);
  EXPECT_LT(ms.back(), 1000.0);
  for (double s : stalled) {
    EXPECT_GT(s, 5.0) << "a stalled connection must not be cut before the read timeout";
    EXPECT_LT(s, 14.0) << "the server answers a stalled request (408) at its 10 s head timeout";
  }
  // Every streaming client got its whole completion, the one it gets alone.
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(got[i].first, 200) << "client " << i << ": " << got[i].second << "\n" << read_file(p("serve.err"));
    if (i % 8 == 0) {
      const auto [status, alone] = complete(body(100 + i, false));
      ASSERT_EQ(status, 200);
      EXPECT_EQ(got[i].second, alone["choices"][0]["text"].get<std::string>()) << "client " << i;
    }
  }
  // Nothing stays held, and the server goes on.
  auto gauge = [&](const std::string& name) {
    const std::string m = client().Get("/metrics")->body, key = name + "{model=\"nano\"} ";
    const size_t at = m.find(key);
    return at == std::string::npos ? -1 : std::stoi(m.substr(at + key.size()));
  };
  for (int i = 0; i < 400 && gauge("loom_requests_running") != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(gauge("loom_requests_running"), 0);
  EXPECT_EQ(gauge("loom_queue_depth"), 0);
  EXPECT_EQ(gauge("loom_kv_caches_in_use"), 0) << "a key/value cache stayed held";
  EXPECT_EQ(gauge("loom_kv_pages_in_use"), 0) << "key/value pages stayed held";
  EXPECT_EQ(gauge("loom_kv_pages_capacity"), 16 * 4) << "a full batch of 64-position windows in 16-position pages";
  EXPECT_EQ(client().Get("/health")->status, 200);
}

// The niceness of each of a process's threads (/proc/PID/task/TID/stat, field 19).
std::vector<int> thread_nices(pid_t pid) {
  std::vector<int> nices;
  for (const auto& task : std::filesystem::directory_iterator(cat("/proc/", pid, "/task"))) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    if (stat.find(')') == std::string::npos) continue;  // the thread ended meanwhile
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // the name may hold anything
    std::string field;
    for (int i = 3; i <= 19 && fields >> field; ++i) {}
    nices.push_back(std::stoi(field));
  }
  return nices;
}

// A client that stops reading mid-stream: the writer that takes every stream's events never
// waits for it (its events wait in the server for room in its socket), the other clients'
// streams go on meanwhile, and once it reads again it gets its whole completion.
TEST_F(Serve, AClientThatStopsReadingHoldsUpNoOneAndGetsItsWholeCompletion) {
  // More events than the server's side of a socket can hold: the kernel grows a TCP send
  // buffer up to tcp_wmem's last figure (4 MiB by default), and an event is over 100 bytes.
  int64_t wmem[3] = {0, 0, 4 << 20};
  std::ifstream("/proc/sys/net/ipv4/tcp_wmem") >> wmem[0] >> wmem[1] >> wmem[2];
  const int tokens = static_cast<int>(std::max<int64_t>(wmem[2], 4 << 20) / 100);
  start({"--model", cat("nano=", p("runs/n")), "--max-batch", "4", "--max-tokens", cat(tokens)});
  auto body = [](int seed, int tokens, bool streamed) {
    return json{{"model", "nano"}, {"prompt", "Q: "}, {"max_tokens", tokens}, {"seed", seed}, {"temperature", 0.9},
                {"stream", streamed}};
  };
  auto slowed = [&] {
    const std::string m = client().Get("/metrics")->body, key = "\nloom_streams_slowed_total ";
    const size_t at = m.find(key);
    return at == std::string::npos ? -1 : std::stoi(m.substr(at + key.size()));
  };
  ASSERT_EQ(slowed(), 0);
  // The thread that writes the events runs at niceness 10 (--events-nice), the others at 0.
  std::vector<int> nices = thread_nices(pid_);
  for (int i = 0; i < 100 && std::count(nices.begin(), nices.end(), 10) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    nices = thread_nices(pid_);
  }
  EXPECT_EQ(std::count(nices.begin(), nices.end(), 10), 1);
  EXPECT_EQ(std::count(nices.begin(), nices.end(), 0), static_cast<long>(nices.size()) - 1);
  std::atomic<bool> reading{false}, paused{false};
  std::string text, buffer;
  int status = -1;
  std::thread slow([&] {
    auto c = client();
    c.set_socket_options([](int fd) {  // a small receive buffer: the server's side fills soon
      const int bytes = 4096;
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    });
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body(7, tokens, true).dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (!paused.exchange(true))  // stops reading after its first bytes, until told
        for (int i = 0; i < 24000 && !reading; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      buffer.append(data, n);
      for (size_t at; (at = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, at + 2))
        if (buffer.starts_with("data: {")) text += json::parse(buffer.substr(6, at - 6))["choices"][0]["text"].get<std::string>();
      return true;
    };
    httplib::Response res;
    httplib::Error error;
    status = c.send(req, res, error) ? res.status : -1;
  });
  // While it does not read, its events back up in the server, and other streams finish.
  for (const auto give_up = Clock::now() + std::chrono::minutes(2); slowed() < 1 && Clock::now() < give_up;)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // (a sanitizer's build is slow)
  EXPECT_EQ(slowed(), 1) << "the stopped client's events never had to wait";
  for (int seed = 20; seed < 23; ++seed) {
    auto c = client();
    const auto [st, streamed] = stream(c, body(seed, 40, true));
    ASSERT_EQ(st, 200) << streamed;
    const auto [st2, alone] = complete(body(seed, 40, false));
    EXPECT_EQ(streamed, alone["choices"][0]["text"].get<std::string>());
  }
  EXPECT_TRUE(paused && !reading) << "the other streams finished while the client did not read";
  reading = true;
  slow.join();
  ASSERT_EQ(status, 200) << read_file(p("serve.err"));
  const auto [st, alone] = complete(body(7, tokens, false));
  ASSERT_EQ(st, 200);
  EXPECT_EQ(text, alone["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(slowed(), 1);
}

// A connected socket to the server on loopback, or -1.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Seconds from sending a streamed completion to its first event (or -1 when it failed).
double first_token_seconds(httplib::Client& c, const json& body) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  const auto t0 = Clock::now();
  double first = -1;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    if (first < 0) first = std::chrono::duration<double>(Clock::now() - t0).count();
    return true;
  };
  httplib::Response res;
  httplib::Error error;
  return c.send(req, res, error) && res.status == 200 ? first : -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Slow clients cannot starve the server (issue 46, item 5; docs/serving.md, "Connections"):
// 100 slow-loris connections (a header byte every second) and 20 idle ones are held by the
// event loop, not by threads; good requests meanwhile get their first token within 100 ms of
// their time alone; each slow connection is answered 408 and closed, and each idle one
// closed, 10 s into its head; a client that half-closes after its request gets its answer.
TEST_F(Serve, SlowAndIdleClientsCannotStarveTheServer) {
  start({"--model", cat("nano=", p("runs/n"))});
  auto body = [](int seed) {
    return json{{"model", "nano"}, {"prompt", "Q: "}, {"max_tokens", 8}, {"seed", seed}, {"stream", true}};
  };
  std::vector<double> alone, loaded;
  for (int i = 0; i < 7; ++i) {
    auto c = client();
    alone.push_back(first_token_seconds(c, body(i)));
    ASSERT_GT(alone.back(), 0);
  }
  constexpr int kSlow = 100, kIdle = 20;
  std::vector<int> slow, idle;
  for (int i = 0; i < kSlow; ++i) slow.push_back(connect_to(port_));
  for (int i = 0; i < kIdle; ++i) idle.push_back(connect_to(port_));
  const auto opened = Clock::now();
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  std::atomic<bool> done{false};
  std::thread loris([&] {  // one byte of a header to each slow connection every second
    for (size_t at = 0; !done; ++at) {
      for (const int fd : slow) (void)!::send(fd, &head[std::min(at, head.size() - 1)], 1, MSG_NOSIGNAL);
      for (int i = 0; i < 20 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // every slow connection has begun its head
  for (int i = 0; i < 7; ++i) {
    auto c = client();
    loaded.push_back(first_token_seconds(c, body(i)));
    ASSERT_GT(loaded.back(), 0) << "a good request failed while slow clients were connected";
  }
  std::printf("first token alone: median %.1f ms; with %d slow and %d idle connections: median %.1f ms\n",
              median(alone) * 1e3, kSlow, kIdle, median(loaded) * 1e3);
  EXPECT_LT(median(loaded), median(alone) + 0.1);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - opened).count(), 8.0) << "the good requests waited";

  // Each slow connection gets 408 and is closed; each idle one is closed; both 10 s into it.
  auto answer_of = [](int fd) {
    timeval tv{.tv_sec = 1, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[512];
    for (int tries = 0; tries < 15; ++tries) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) got.append(buf, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return got + "<closed>";
    }
    return got + "<open>";
  };
  for (const int fd : slow) {
    const std::string got = answer_of(fd);
    EXPECT_TRUE(got.starts_with("HTTP/1.1 408 Request Timeout") && got.ends_with("<closed>")) << got;
  }
  for (const int fd : idle) EXPECT_EQ(answer_of(fd), "<closed>");
  const double waited = std::chrono::duration<double>(Clock::now() - opened).count();
  EXPECT_GT(waited, 9.0);
  EXPECT_LT(waited, 16.0);
  done = true;
  loris.join();
  for (const int fd : slow) ::close(fd);
  for (const int fd : idle) ::close(fd);

  // A client that half-closes after its request still gets its answer.
  const int fd = connect_to(port_);
  const std::string request = json{{"model", "nano"}, {"prompt", "Q: "}, {"max_tokens", 4}, {"seed", 1}}.dump();
  const std::string whole = cat("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
                                "Content-Length: ", request.size(), "\r\n\r\n", request);
  ASSERT_EQ(::send(fd, whole.data(), whole.size(), MSG_NOSIGNAL), static_cast<ssize_t>(whole.size()));
  ::shutdown(fd, SHUT_WR);
  const std::string got = answer_of(fd);
  ::close(fd);
  EXPECT_TRUE(got.starts_with("HTTP/1.1 200 OK")) << got;
  EXPECT_NE(got.find("\"text_completion\""), std::string::npos) << got;
  EXPECT_EQ(client().Get("/health")->status, 200);
}

}  // namespace
}  // namespace loom
