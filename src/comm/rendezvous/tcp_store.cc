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
#include "comm/net.h"
#include "comm/rendezvous/kv_table.h"
#include "loom/log.h"
#include "loom/rendezvous.h"

namespace loom::comm {

using store_protocol::Request;
using store_protocol::Response;
using store_protocol::Status;

namespace {

constexpr auto kHandshakeTimeout = std::chrono::seconds(5);

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

  std::mutex mu;  // guards the handoff of handshaken clients and auth notices
  std::vector<std::unique_ptr<Client>> arrived;
  std::vector<std::string> auth_failures;
  std::vector<std::thread> handshakes;

  KvTable table;  // owned by the loop thread
  std::list<std::unique_ptr<Client>> clients;
  std::list<Parked> parked;
  std::vector<std::string> notices;  // auth failures of this job's ranks, oldest first

  void wake() {
    char c = 1;
    [[maybe_unused]] auto n = ::write(wake_pipe[1], &c, 1);
  }

  void handshake(net::Fd fd) {
    std::string who = net::peer_address(fd.get());
    try {
      auto hello = auth::accept_handshake(
          fd.get(), config.secret, Clock::now() + kHandshakeTimeout, [&](const auth::Hello& h) {
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
    } catch (const AuthError& e) {
      std::string what = e.what();
      log_warn(cat("store: refused ", who, ": ", what));
      // Only failures that claim this job are the job's business: a stale job's rank is
      // refused quietly, a wrong secret claiming our job fails the waiting ranks at once.
      if (what.find("wrong secret") != std::string::npos &&
          what.find("job '" + config.job_id + "'") != std::string::npos) {
        std::lock_guard lock(mu);
        auth_failures.push_back(cat(what, " from ", who));
      }
    } catch (const Error& e) {
      log_warn(cat("store: dropped connection from ", who, ": ", e.what()));
    }
    wake();
  }

  void adopt_arrivals() {
    std::lock_guard lock(mu);
    for (auto& c : arrived) clients.push_back(std::move(c));
    arrived.clear();
    for (auto& n : auth_failures) notices.push_back(std::move(n));
    auth_failures.clear();
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
    if (!notices.empty()) {
      respond(c, Response{Status::kPeerAuthFailed, notices.back()});
      return;
    }
    Deadline deadline = Clock::now() + milliseconds(r.timeout_ms);
    parked.push_back({c, std::move(r), deadline});
  }

  void retry_parked() {
    for (auto it = parked.begin(); it != parked.end();) {
      std::optional<Response> out;
      if (!(out = table.try_apply(it->request)) && !notices.empty())
        out = Response{Status::kPeerAuthFailed, notices.back()};
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
        while (auto fd = net::accept_until(listener.get(), Clock::now())) {
          handshakes.emplace_back([this, f = std::make_shared<net::Fd>(std::move(fd))]() mutable {
            handshake(std::move(*f));
          });
        }
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
  for (auto& t : impl_->handshakes) t.join();
  ::close(impl_->wake_pipe[0]);
  ::close(impl_->wake_pipe[1]);
}

int TcpStoreServer::port() const { return net::local_port(impl_->listener.get()); }

struct TcpStore::Impl {
  TcpStoreConfig config;
  net::Fd fd;
  std::string who;
};

TcpStore::TcpStore(const TcpStoreConfig& config, Deadline d) : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  impl_->who = cat("store ", config.host, ":", config.port);
  impl_->fd = net::connect_tcp(config.host, config.port, d, impl_->who);
  auth::connect_handshake(impl_->fd.get(), config.secret,
                          {.job_id = config.job_id, .purpose = "store", .rank = config.rank},
                          d, impl_->who);
}

TcpStore::~TcpStore() = default;

Response TcpStore::call(const Request& r, Deadline d) {
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

std::string generate_secret() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string raw = auth::random_bytes(32), out;
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace loom::comm
