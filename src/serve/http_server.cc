// The HTTP/1.1 server of include/loom/serve/http_server.h. One thread runs an Asio event loop that
// accepts connections and reads each request (Beast's parser) under a deadline of its own;
// complete requests go to a pool of handler threads, each of which writes its response on
// the socket itself and hands the connection back to the loop for the next request.
#include "loom/serve/http_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "loom/core/error.h"

namespace loom::http {

namespace {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Writes all of `data`, waiting for room in the socket at most `timeout` in all.
bool send_all(int fd, std::string_view data, std::chrono::milliseconds timeout) {
  const Clock::time_point give_up = Clock::now() + timeout;
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) return false;
  }
  return true;
}

enum class Framing { kLength, kChunked, kUntilClose };

std::string head_of(const Response& r, bool close, Framing framing) {
  const auto reason = bhttp::obsolete_reason(bhttp::int_to_status(static_cast<unsigned>(r.status)));
  std::string head = cat("HTTP/1.1 ", r.status, " ", std::string(reason.data(), reason.size()), "\r\nContent-Type: ",
                         r.content_type, "\r\n");
  if (framing == Framing::kLength) head += cat("Content-Length: ", r.body.size(), "\r\n");
  if (framing == Framing::kChunked) head += "Transfer-Encoding: chunked\r\n";
  if (framing != Framing::kLength) head += "Cache-Control: no-cache\r\n";
  return head + (close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n");
}

class SocketSink final : public Sink {
 public:
  SocketSink(int fd, bool chunked, std::chrono::milliseconds timeout) : fd_(fd), chunked_(chunked), timeout_(timeout) {}
  bool write(std::string_view data) override {
    if (data.empty()) return true;  // an empty chunk would end the body
    if (!chunked_) return send_all(fd_, data, timeout_);
    return send_all(fd_, chunk(data), timeout_);
  }
  std::optional<std::string> write_now(std::string_view data) override {
    if (data.empty()) return "";
    std::string framed = chunked_ ? chunk(data) : std::string(data);
    size_t sent = 0;
    while (sent < framed.size()) {
      const ssize_t n = ::send(fd_, framed.data() + sent, framed.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) break;  // no more room now
      return std::nullopt;
    }
    framed.erase(0, sent);
    return framed;
  }
  bool write_rest(std::string_view rest) override { return send_all(fd_, rest, timeout_); }

 private:
  static std::string chunk(std::string_view data) {
    char size[24];
    const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string framed;
    framed.reserve(static_cast<size_t>(n) + data.size() + 2);
    framed.append(size, static_cast<size_t>(n)).append(data).append("\r\n");
    return framed;
  }

  int fd_;
  bool chunked_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::string Request::field(std::string_view name) const {
  for (const auto& [n, v] : fields)
    if (same_name(n, name)) return v;
  return "";
}

size_t Request::count(std::string_view name) const {
  return static_cast<size_t>(std::count_if(fields.begin(), fields.end(), [&](const auto& f) { return same_name(f.first, name); }));
}

class Connection;

struct Server::Impl {
  Impl(ServerOptions o, Handlers h) : options(std::move(o)), handlers(std::move(h)) {}
  ~Impl() { join_workers(); }

  // The handler pool: `handler_threads` run requests, as many more may wait.
  bool enqueue(std::function<void()> job) {
    std::lock_guard lock(mu);
    if (stopping || jobs.size() >= static_cast<size_t>(options.handler_threads)) return false;
    jobs.push_back(std::move(job));
    ready.notify_one();
    return true;
  }
  void work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mu);
        ready.wait(lock, [&] { return stopping || !jobs.empty(); });
        if (stopping) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      job();
    }
  }
  void join_workers() {
    {
      std::lock_guard lock(mu);
      stopping = true;
      jobs.clear();
      ready.notify_all();
    }
    for (std::thread& t : workers) t.join();
    workers.clear();
  }

  void accept();
  void shut_all();

  const ServerOptions options;
  const Handlers handlers;
  std::mutex mu;  // jobs, stopping, connections
  std::condition_variable ready;
  std::deque<std::function<void()>> jobs;
  bool stopping = false;
  std::vector<std::thread> workers;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;
  std::atomic<int> open{0};
  int port = 0;
  // Last, so that they go first: what the loop still holds (connections) is destroyed while
  // the members above, which a connection's destructor touches, still exist.
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};  // after a failed accept (no file descriptors left)
};

// One client connection: its requests are read on the loop's thread, each handled (and its
// response written) on a handler thread, one at a time.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl& server, tcp::socket socket)
      : server_(server), options_(server.options), socket_(std::move(socket)), timer_(server.io) {
    ++server_.open;
  }
  ~Connection() {
    --server_.open;
    std::lock_guard lock(server_.mu);
    server_.connections.erase(this);
  }

  void start() {
    {
      std::lock_guard lock(server_.mu);
      server_.connections[this] = weak_from_this();
    }
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);  // a stream's events are small writes, each wanted now
    read_head();
  }

  // From the loop's thread, at stop: a read waiting ends, a handler's next write fails.
  void shut() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
  }

 private:
  void read_head() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options_.max_head_bytes));
    // None until the head is read, so that the head handler sees a Content-Length over it
    // (boost::none would refuse every length: Beast 1.74 compares it as below any value).
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    arm(options_.head_timeout);
    bhttp::async_read_header(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->disarm();
      if (ec || self->timed_out_) return self->failed(ec, false);
      self->on_head();
    });
  }

  void on_head() {
    const auto& m = parser_->get();
    request_ = Request{};
    request_.method.assign(m.method_string().data(), m.method_string().size());
    const std::string target(m.target().data(), m.target().size());
    request_.path = target.substr(0, target.find('?'));
    for (const auto& f : m) request_.fields.emplace_back(std::string(f.name_string()), std::string(f.value()));
    http10_ = m.version() < 11;
    if (request_.fields.size() > static_cast<size_t>(options_.max_fields))
      return refuse(error(431, cat("the request has ", request_.fields.size(), " header fields; at most ", options_.max_fields)));
    if (server_.handlers.head)
      if (std::optional<Response> answer = server_.handlers.head(request_)) return refuse(std::move(*answer));
    if (parser_->is_done()) return dispatch();
    if (parser_->content_length() && *parser_->content_length() > options_.max_body_bytes)
      return refuse(error(413, cat("the body is over ", options_.max_body_bytes, " bytes")));
    if (same_name(request_.field("Expect"), "100-continue")) {  // the client waits for this before its body
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(options_.write_timeout);
      return asio::async_write(socket_, asio::buffer(kContinue.data(), kContinue.size()),
                               [self = shared_from_this()](error_code ec, size_t) {
                                 self->disarm();
                                 if (ec || self->timed_out_) return self->close();
                                 self->read_body();
                               });
    }
    read_body();
  }

  void read_body() {
    parser_->body_limit(options_.max_body_bytes);  // a chunked body is refused as it crosses it
    arm(options_.body_timeout);
    bhttp::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->disarm();
      if (ec || self->timed_out_) return self->failed(ec, true);
      self->dispatch();
    });
  }

  // A read that ended without a request: the client left, was too slow, or sent what is
  // not HTTP or is over a limit.
  void failed(error_code ec, bool in_body) {
    if (timed_out_) {
      if (!in_body && !parser_->got_some() && buffer_.size() == 0) return close();  // idle: nothing to answer
      return refuse(error(408, cat("the request's ", in_body ? "body" : "head", " took longer than ",
                                   (in_body ? options_.body_timeout : options_.head_timeout).count() / 1000.0, " s")));
    }
    if (ec == bhttp::error::header_limit)
      return refuse(error(431, cat("the request head is over ", options_.max_head_bytes, " bytes")));
    if (ec == bhttp::error::body_limit) return refuse(error(413, cat("the body is over ", options_.max_body_bytes, " bytes")));
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec.category() != make_error_code(bhttp::error::end_of_stream).category())
      return close();  // the client closed or reset the connection
    refuse(error(400, cat("malformed request: ", ec.message())));
  }

  Response error(int status, const std::string& message) const { return server_.handlers.error(status, message, request_.path); }

  void dispatch() {
    request_.body = std::move(parser_->get().body());
    keep_alive_ = parser_->get().keep_alive();
    if (!server_.enqueue([self = shared_from_this()] { self->handle(); }))
      refuse(error(503, cat("every handler is busy (", options_.handler_threads, " running, as many waiting); try again later")));
  }

  // On a handler thread: the loop does not touch this connection until it is handed back.
  void handle() {
    Response r;
    try {
      r = server_.handlers.request(request_);
    } catch (...) {
      r = error(500, what_of(std::current_exception()));
    }
    const int fd = socket_.native_handle();
    bool close_after = r.close || !keep_alive_;
    bool sent;
    if (r.stream) {
      close_after = close_after || http10_;  // without chunks, the end of the body is the end of the connection
      sent = send_all(fd, head_of(r, close_after, http10_ ? Framing::kUntilClose : Framing::kChunked), options_.write_timeout);
      SocketSink sink(fd, !http10_, options_.write_timeout);
      sent = sent && r.stream(sink) && (http10_ || send_all(fd, "0\r\n\r\n", options_.write_timeout));
    } else {
      sent = send_all(fd, head_of(r, close_after, Framing::kLength) + r.body, options_.write_timeout);
    }
    r = Response{};  // what the handler holds (a stream's generation) goes now
    asio::post(server_.io, [self = shared_from_this(), sent, close_after] {
      if (!sent) return self->close();
      if (close_after) return self->linger();
      self->read_head();
    });
  }

  // Answers and closes: the answer goes out, then what the client still sends (the body of
  // the refused request) is read and dropped, up to drain_bytes, so that a client that is
  // still writing reads its answer: closing a socket with bytes unread sends a reset, and
  // the client loses what it had not read yet.
  void refuse(Response r) {
    auto text = std::make_shared<std::string>(head_of(r, true, Framing::kLength) + r.body);
    arm(options_.write_timeout);
    asio::async_write(socket_, asio::buffer(*text), [self = shared_from_this(), text](error_code ec, size_t) {
      self->disarm();
      if (ec || self->timed_out_) return self->close();
      self->linger();
    });
  }

  void linger() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    drained_ = buffer_.size();
    buffer_.consume(buffer_.size());
    arm(options_.head_timeout);
    drain();
  }

  void drain() {
    if (drained_ >= options_.drain_bytes) return close();
    if (!scratch_) scratch_ = std::make_unique<char[]>(kScratch);
    socket_.async_read_some(asio::buffer(scratch_.get(), kScratch), [self = shared_from_this()](error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->timed_out_) {
        self->disarm();
        return self->close();
      }
      self->drain();
    });
  }

  void close() {
    disarm();
    error_code ignored;
    socket_.close(ignored);
  }

  // A deadline for the operation that follows: when it passes first, that operation is
  // cancelled and ends with timed_out_ set.
  void arm(std::chrono::milliseconds timeout) {
    timed_out_ = false;
    const uint64_t id = ++deadline_;
    timer_.expires_after(timeout);
    timer_.async_wait([weak = weak_from_this(), id](error_code ec) {
      const auto self = weak.lock();
      if (ec || !self || self->deadline_ != id) return;  // cancelled, or a later operation's
      self->timed_out_ = true;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void disarm() {
    ++deadline_;  // a deadline whose wait has already ended acts on nothing
    timer_.cancel();
  }

  static constexpr size_t kScratch = 64 << 10;
  Server::Impl& server_;
  const ServerOptions& options_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  uint64_t deadline_ = 0;
  bool timed_out_ = false;
  boost::beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Request request_;
  bool keep_alive_ = false, http10_ = false;
  size_t drained_ = 0;
  std::unique_ptr<char[]> scratch_;
};

void Server::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;  // stopped
    if (ec) {  // out of file descriptors, say: try again shortly rather than spin
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this](error_code e) {
        if (!e) accept();
      });
      return;
    }
    if (open.load() >= options.max_connections) {
      error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<Connection>(*this, std::move(socket))->start();
    }
    accept();
  });
}

void Server::Impl::shut_all() {
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard lock(mu);
    for (const auto& [raw, weak] : connections)
      if (auto c = weak.lock()) all.push_back(std::move(c));
  }
  for (const auto& c : all) c->shut();
}

Server::Server(ServerOptions options, Handlers handlers) : impl_(std::make_unique<Impl>(std::move(options), std::move(handlers))) {
  Impl& s = *impl_;
  LOOM_CHECK(s.handlers.request && s.handlers.error);
  const std::string where = cat(printable(s.options.host), ":", s.options.port);
  error_code ec;
  tcp::resolver resolver(s.io);
  const auto found = resolver.resolve(s.options.host, std::to_string(s.options.port), tcp::resolver::passive, ec);
  if (ec || found.empty()) throw RuntimeError(cat("serve: cannot listen on ", where, ": ", ec ? ec.message() : "no such address"));
  const tcp::endpoint endpoint = found.begin()->endpoint();
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);  // a burst of clients waits, none dropped
  if (ec) throw RuntimeError(cat("serve: cannot listen on ", where, ": ", ec.message()));
  s.port = s.acceptor.local_endpoint().port();
}

Server::~Server() = default;

int Server::port() const { return impl_->port; }

void Server::run() {
  Impl& s = *impl_;
  for (int i = 0; i < s.options.handler_threads; ++i) s.workers.emplace_back([&s] { s.work(); });
  s.accept();
  s.io.run();
  s.join_workers();
}

void Server::stop() {
  asio::post(impl_->io, [&s = *impl_] {
    error_code ignored;
    s.acceptor.close(ignored);
    s.retry.cancel();
    s.shut_all();
  });
}

}  // namespace loom::http
