#include "loom/serve/http_server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <future>
#include <optional>
#include <string>
#include <thread>

namespace loom::http {
namespace {

// A client socket on loopback with a small receive buffer, its request (HTTP/1.`minor`) sent.
int request_stream(int port, int minor) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int bytes = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string head =
      "GET /stream HTTP/1." + std::to_string(minor) + "\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(::write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  return fd;
}

// The body of a response read to the connection's end: chunked, or (HTTP/1.0) as it came.
std::string read_body(int fd, bool chunked) {
  std::string all;
  char buffer[1 << 16];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) all.append(buffer, static_cast<size_t>(n));
  std::string body;
  size_t at = all.find("\r\n\r\n");
  if (at == std::string::npos) return "no head: " + all.substr(0, 200);
  if (!chunked) return all.substr(at + 4);
  for (at += 4;;) {
    const size_t line = all.find("\r\n", at);
    if (line == std::string::npos) return "the body ends inside a chunk's size line";
    const size_t size = std::stoul(all.substr(at, line - at), nullptr, 16);
    if (size == 0) return body;
    body += all.substr(line + 2, size);
    at = line + 2 + size + 2;
  }
}

// A write the socket has no room for goes out as far as it fits, at once (the server's
// delivery thread writes many clients' streams and waits for none), and what is left goes
// out after it, whole: the client reads the chunk it would have read from one write (an
// HTTP/1.0 client, whose body is not chunked, the bytes).
void write_now_to_a_client_that_reads_nothing(int minor) {
  // More than the socket's buffers hold: the kernel grows a TCP send buffer up to tcp_wmem's
  // last figure (4 MiB by default), and the client's receive buffer is small.
  int64_t wmem[3] = {0, 0, 4 << 20};
  std::ifstream("/proc/sys/net/ipv4/tcp_wmem") >> wmem[0] >> wmem[1] >> wmem[2];
  const std::string first(static_cast<size_t>(2 * std::max<int64_t>(wmem[2], 4 << 20) + (8 << 20)), 'a');
  const std::string second = "and then the next chunk";
  std::promise<void> wrote_now;
  std::optional<std::string> rest;
  ServerOptions options;
  options.handler_threads = 2;
  options.write_timeout = std::chrono::milliseconds(60000);  // far past what the test waits for
  Handlers handlers;
  handlers.request = [&](const Request&) {
    Response r;
    r.stream = [&](Sink& sink) {
      rest = sink.write_now(first);
      wrote_now.set_value();
      return rest && sink.write_rest(*rest) && sink.write(second);
    };
    return r;
  };
  handlers.error = [](int status, const std::string& message, const std::string&) {
    return Response{.status = status, .body = message};
  };
  Server server(options, handlers);
  std::thread serving([&] { server.run(); });
  const int fd = request_stream(server.port(), minor);
  // The client reads nothing until write_now has returned (a minute at most: the write
  // timeout, where a write that waits gives up).
  const bool returned = wrote_now.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "write_now waited for a client that reads nothing";
  EXPECT_TRUE(!returned || rest.has_value()) << "write_now found the connection failed";
  if (returned && rest) {
    EXPECT_FALSE(rest->empty()) << first.size() << " bytes fit in the socket's buffers";
    EXPECT_LT(rest->size(), first.size()) << "nothing of the chunk went out";
    const std::string body = read_body(fd, minor == 1);
    EXPECT_TRUE(body == first + second) << body.size() << " bytes: " << body.substr(0, 100);
  }
  ::close(fd);  // (when write_now waited, its send fails now)
  server.stop();
  serving.join();
}

TEST(HttpSink, WriteNowNeverWaitsAndWriteRestFinishesTheChunk) {
  write_now_to_a_client_that_reads_nothing(1);
}

TEST(HttpSink, WriteNowNeverWaitsOnAnHttp10Client) {
  write_now_to_a_client_that_reads_nothing(0);
}

}  // namespace
}  // namespace loom::http
