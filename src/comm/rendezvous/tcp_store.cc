// TcpStore: the server is one thread polling its listener and authenticated clients;
// handshakes run on short-lived threads so a slow or hostile connection never stalls
// the others. Blocking requests (get, wait) are parked until a mutation satisfies them
// or their timeout passes.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "comm/auth.h"
#include "comm/handshake_budget.h"
#include "comm/net.h"
#include "comm/rendezvous/kv_table.h"
#include "loom/core/log.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {

using store_protocol::Request;
using store_protocol::Response;
using store_protocol::Status;

namespace {

struct Client {
  net::Fd fd;
  std::string who;
  std::string in;   // bytes received, not yet a whole frame
  std::string out;  // bytes to send
  bool dead = false;
};

struct Parked {
  Client* client;
  Request request;
  Deadline deadline;
};

}  // namespace

struct TcpStoreServer::Impl {
  TcpStoreConfig config;
  net::Fd listener;
  int wake_pipe[2] = {-1, -1};
  std::thread loop;
  std::atomic<bool> stop{false};

  std::mutex mu;  // guards the handoff of handshaken clients
  std::vector<std::unique_ptr<Client>> arrived;
  HandshakeBudget budget;

  struct Handshake {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Handshake> handshakes;  // owned by the loop thread; finished ones are joined there

  KvTable table;  // owned by the loop thread
  std::list<std::unique_ptr<Client>> clients;
  std::list<Parked> parked;

  void wake() {
    char c = 1;
    [[maybe_unused]] auto n = ::write(wake_pipe[1], &c, 1);
  }

  // A connection that fails its handshake is logged (address, reason) and dropped; it is
  // never the job's business (docs/security.md): no rank hears of it.
  void handshake(net::Fd fd) {
    const std::string who = net::peer_address(fd.get());
    auto refused = [&](const std::string& why) {
      if (const int64_t n = budget.to_log(host_of(who)); n > 0)
        log_warn(cat("store: refused ", who, ": ", why, n > 1 ? cat(" (", n, " refusals from this address since the last line)") : ""));
    };
    try {
      auto hello = auth::accept_handshake(
          fd.get(), config.secret, Clock::now() + auth::kHandshakeTimeout, [&](const auth::Hello& h) {
            if (h.purpose != "store") return cat("this is a store; connection is for '", h.purpose, "'");
            if (h.job_id != config.job_id)
              return cat("this store belongs to job '", config.job_id, "', not job '", h.job_id,
                         "' (a rank of a stale job?)");
            return std::string();
          });
      auto c = std::make_unique<Client>();
      c->fd = std::move(fd);
      c->who = hello.rank >= 0 ? cat("rank ", hello.rank, " (", who, ")") : who;
      std::lock_guard lock(mu);
      arrived.push_back(std::move(c));
    } catch (const Error& e) {
      refused(e.what());
    }
    budget.finish(host_of(who));
    wake();
  }

  void adopt_arrivals() {
    std::lock_guard lock(mu);
    for (auto& c : arrived) clients.push_back(std::move(c));
    arrived.clear();
  }

  // Starts the handshake of a new connection on its own thread, within its address's budget.
  void admit(net::Fd fd) {
    const std::string who = net::peer_address(fd.get());
    if (!budget.admit(host_of(who))) {
      if (const int64_t n = budget.to_log(host_of(who)); n > 0)
        log_warn(cat("store: closed ", n, " connection(s) from ", host_of(who), " over its handshake budget"));
      return;  // closed unread
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    handshakes.push_back({std::thread([this, done, f = std::make_shared<net::Fd>(std::move(fd))]() mutable {
                            handshake(std::move(*f));
                            done->store(true);
                          }),
                          done});
  }

  void join_finished_handshakes() {
    for (auto it = handshakes.begin(); it != handshakes.end();) {
      if (!it->done->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = handshakes.erase(it);
    }
  }

  void respond(Client* c, const Response& r) {
    std::string body = store_protocol::encode_response(r);
    uint32_t n = static_cast<uint32_t>(body.size());
    c->out.append(reinterpret_cast<const char*>(&n), 4).append(body);
  }

  void handle(Client* c, Request r) {
    if (auto out = table.try_apply(r)) {
      respond(c, *out);
      return;
    }
    Deadline deadline = Clock::now() + milliseconds(r.timeout_ms);
    parked.push_back({c, std::move(r), deadline});
  }

  void retry_parked() {
    for (auto it = parked.begin(); it != parked.end();) {
      std::optional<Response> out;
      out = table.try_apply(it->request);
      if (!out && Clock::now() >= it->deadline) out = Response{Status::kTimeout, {}};
      if (out) {
        respond(it->client, *out);
        it = parked.erase(it);
      } else {
        ++it;
      }
    }
  }

  void read_from(Client* c) {
    char buf[65536];
    for (;;) {
      ssize_t r = ::recv(c->fd.get(), buf, sizeof buf, 0);
      if (r > 0) {
        c->in.append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (r < 0 && errno == EINTR) continue;
      c->dead = true;
      return;
    }
    size_t pos = 0;
    while (c->in.size() - pos >= 4) {
      uint32_t n = 0;
      std::memcpy(&n, c->in.data() + pos, 4);
      if (n > store_protocol::kMaxFrame) {
        log_warn(cat("store: ", c->who, " sent a ", n, "-byte frame (cap ",
                     store_protocol::kMaxFrame, "); dropping it"));
        c->dead = true;
        return;
      }
      if (c->in.size() - pos - 4 < n) break;
      try {
        handle(c, store_protocol::parse_request(std::string_view(c->in).substr(pos + 4, n)));
      } catch (const CommError& e) {
        log_warn(cat("store: ", c->who, ": ", e.what(), "; dropping it"));
        c->dead = true;
        return;
      }
      pos += 4 + n;
    }
    c->in.erase(0, pos);
  }

  void write_to(Client* c) {
    while (!c->out.empty()) {
      ssize_t w = ::send(c->fd.get(), c->out.data(), c->out.size(), MSG_NOSIGNAL);
      if (w > 0) {
        c->out.erase(0, static_cast<size_t>(w));
        continue;
      }
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (w < 0 && errno == EINTR) continue;
      c->dead = true;
      return;
    }
  }

  void run() {
    while (!stop.load()) {
      adopt_arrivals();
      join_finished_handshakes();
      retry_parked();
      std::vector<pollfd> fds{{listener.get(), POLLIN, 0}, {wake_pipe[0], POLLIN, 0}};
      std::vector<Client*> order;
      for (auto& c : clients) {
        fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
        order.push_back(c.get());
      }
      int wait_ms = 1000;
      for (auto& p : parked) {
        auto ms = std::chrono::duration_cast<milliseconds>(p.deadline - Clock::now()).count() + 1;
        wait_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, wait_ms));
      }
      if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) sys_check(-1, "poll", "store");
      if (fds[1].revents) {
        char buf[64];
        while (::read(wake_pipe[0], buf, sizeof buf) > 0) {
        }
      }
      if (fds[0].revents & POLLIN) {
        while (auto fd = net::accept_until(listener.get(), Clock::now())) admit(std::move(fd));
      }
      for (size_t i = 0; i < order.size(); ++i) {
        if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) read_from(order[i]);
        if (!order[i]->dead) write_to(order[i]);
      }
      std::erase_if(parked, [](const Parked& p) { return p.client->dead; });
      std::erase_if(clients, [](const std::unique_ptr<Client>& c) { return c->dead; });
    }
  }
};

TcpStoreServer::TcpStoreServer(const TcpStoreConfig& config) : impl_(std::make_unique<Impl>()) {
  if (config.secret.empty() && !net::is_loopback(config.host))
    throw InputError(cat("refusing to serve the store on non-loopback address ", config.host,
                         " without a secret (set LOOM_SECRET or LOOM_SECRET_FILE)"));
  impl_->config = config;
  impl_->listener = net::listen_tcp(config.host, config.port);
  sys_check(::pipe2(impl_->wake_pipe, O_NONBLOCK | O_CLOEXEC), "pipe2", "store");
  impl_->loop = std::thread([this] { impl_->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop = true;
  impl_->wake();
  impl_->loop.join();
  for (auto& h : impl_->handshakes) h.thread.join();
  ::close(impl_->wake_pipe[0]);
  ::close(impl_->wake_pipe[1]);
}

int TcpStoreServer::port() const { return net::local_port(impl_->listener.get()); }

struct TcpStore::Impl {
  TcpStoreConfig config;
  net::Fd fd;
  std::string who;
  // One exchange at a time: the communicators sharing this client (splits, a parameter
  // server's links) beat through it from their own threads. A plain mutex polled until the
  // deadline, not std::timed_mutex: libstdc++ waits for that one with
  // pthread_mutex_clocklock, which ThreadSanitizer (LLVM 14) does not intercept, so every
  // later unlock was reported as an unlock of an unlocked mutex and the tsan preset's
  // process tests failed. Two requests rarely meet here; the loser's poll costs nothing.
  std::mutex mu;
};

TcpStore::TcpStore(const TcpStoreConfig& config, Deadline d) : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  impl_->who = cat("store ", config.host, ":", config.port);
  // A connection the server closes before the handshake ends (its address over the
  // handshake budget while someone floods it) is retried; a refusal with a reason is not.
  for (auto pause = milliseconds(5);; pause = std::min(pause * 2, milliseconds(200))) {
    impl_->fd = net::connect_tcp(config.host, config.port, d, impl_->who);
    try {
      auth::connect_handshake(impl_->fd.get(), config.secret,
                              {.job_id = config.job_id, .purpose = "store", .rank = config.rank}, d, impl_->who);
      return;
    } catch (const AuthError&) {
      throw;
    } catch (const CommError& e) {
      if (Clock::now() + pause >= d)
        throw TimeoutError(cat("cannot complete the handshake with ", impl_->who, " before the deadline: ", e.what()), -1);
    }
    std::this_thread::sleep_for(pause);
  }
}

TcpStore::~TcpStore() = default;

Response TcpStore::call(const Request& r, Deadline d) {
  std::unique_lock lock(impl_->mu, std::defer_lock);
  if (d == Deadline::max()) lock.lock();
  while (!lock.owns_lock() && !lock.try_lock()) {
    if (Clock::now() >= d)
      throw TimeoutError(cat(impl_->who, ": another thread's request held the connection past the deadline"), -1);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!impl_->fd) throw CommError(cat(impl_->who, ": connection already failed"), -1);
  std::string body = store_protocol::encode_request(r);
  uint32_t n = static_cast<uint32_t>(body.size());
  // The server enforces a blocking request's own timeout; the grace covers its reply in
  // flight. Other requests get no grace: a heartbeat over a dead link must not stall.
  bool blocks = r.cmd == store_protocol::Cmd::kGet || r.cmd == store_protocol::Cmd::kWait;
  Deadline io = d == Deadline::max() || !blocks ? d : d + std::chrono::seconds(1);
  try {
    net::write_all(impl_->fd.get(), &n, 4, io, impl_->who);
    net::write_all(impl_->fd.get(), body.data(), body.size(), io, impl_->who);
    net::read_exact(impl_->fd.get(), &n, 4, io, impl_->who);
    if (n > store_protocol::kMaxFrame)
      throw CommError(cat(impl_->who, " answered with a ", n, "-byte frame (cap ",
                          store_protocol::kMaxFrame, ")"), -1);
    std::string reply(n, '\0');
    net::read_exact(impl_->fd.get(), reply.data(), n, io, impl_->who);
    return store_protocol::parse_response(reply);
  } catch (...) {
    impl_->fd = net::Fd();  // a half-done exchange leaves the stream out of step
    throw;
  }
}

std::string generate_secret() { return auth::hex(auth::random_bytes(32)); }

}  // namespace loom::comm
