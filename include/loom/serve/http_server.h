// An HTTP/1.1 server that no client can starve (docs/serving.md, "Connections"): one event
// loop reads every connection's request head and body under deadlines (Boost.Beast on
// Asio), so a client that sends a byte every few seconds costs a socket, not a thread; a
// pool of handler threads runs complete requests, each writing its own response (a
// streamed one included) on its thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::http {

// A request as read: its head (method, path, fields in the order sent), then its body.
struct Request {
  std::string method;  // as sent: "GET", "POST", ...
  std::string path;    // the target up to any '?'
  std::vector<std::pair<std::string, std::string>> fields;
  std::string body;

  // The value of the first field named `name` (any case), or "".
  std::string field(std::string_view name) const;
  // How many fields are named `name` (any case).
  size_t count(std::string_view name) const;
};

// Where a streamed response's body goes: the client's socket, chunk by chunk. Written by one
// thread at a time (the handler's, or one it hands the sink to meanwhile).
class Sink {
 public:
  virtual ~Sink() = default;
  // Writes one chunk, waiting for room up to the server's write timeout; false: the client
  // left or read nothing for that long.
  virtual bool write(std::string_view data) = 0;
  // Writes as much of one chunk as the socket takes now, never waiting: what is left of it
  // (framing included, for write_rest), "" when all of it went; nullopt: the client left.
  virtual std::optional<std::string> write_now(std::string_view data) = 0;
  // Writes what write_now left, as it is, waiting like write.
  virtual bool write_rest(std::string_view rest) = 0;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  bool close = false;  // close the connection once this response is out
  // A streamed response (chunked): called on the handler's thread once the head is out,
  // returns whether the stream ended (false: the client left, the connection is closed).
  std::function<bool(Sink&)> stream;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                     // 0: any free port (Server::port() says which)
  int handler_threads = 8;          // requests handled at once; as many again may wait; past that 503
  int max_connections = 1024;       // open at once; a connection past it is closed as it is accepted
  size_t max_head_bytes = 16 << 10;  // request line and fields; past it 431
  int max_fields = 100;              // past it 431
  size_t max_body_bytes = 1 << 20;   // past it 413, the body never kept
  size_t drain_bytes = 4 << 20;      // a refused request's body read on and dropped, so the client reads the answer
  std::chrono::milliseconds head_timeout{10000};   // the whole head, from the connection or the last response: 408
  std::chrono::milliseconds body_timeout{20000};   // the whole body, from its head: 408
  std::chrono::milliseconds write_timeout{10000};  // a response write that finds no room waits this long at most
};

struct Handlers {
  // Runs on the head alone, before any of the body is read: an answer refuses the request
  // (it goes out, and the connection closes once what the client still sends is dropped).
  std::function<std::optional<Response>(const Request& head)> head;
  // The whole request, on a handler thread. What it throws is answered 500 by `error`.
  std::function<Response(const Request& request)> request;
  // The server's own answers: 400 (malformed), 408 (too slow), 413 (body over the limit),
  // 431 (head over its limits), 500 (a handler threw), 503 (every handler busy and as many
  // waiting). `path` is "" when the head was not read.
  std::function<Response(int status, const std::string& message, const std::string& path)> error;
};

class Server {
 public:
  // Binds (and listens) now: a refused address throws RuntimeError naming it.
  Server(ServerOptions options, Handlers handlers);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // Serves until stop(); then waits for the requests being handled.
  void run();
  // From any thread (not a signal handler): no new connection; the open ones are shut.
  void stop();

 private:
  friend class Connection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::http
