#include "comm/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace loom::comm::net {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

namespace {

sockaddr_in resolve(const std::string& host, int port, bool for_listen) {
  if (port < 0 || port > 65535) throw InputError(cat("port ", port, " is out of range 0..65535"));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw InputError(cat("address '", host, "' does not resolve to an IPv4 address",
                         for_listen ? " to listen on" : "", ": ", gai_strerror(rc)));
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

long remaining_ms(Deadline d) {
  auto now = Clock::now();
  if (d <= now) return 0;
  if (d == Deadline::max()) return 1000;
  auto ms = std::chrono::duration_cast<milliseconds>(d - now).count() + 1;
  return std::min<long>(ms, 1000);
}

}  // namespace

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) != 1) return false;
  return (ntohl(a.s_addr) >> 24) == 127;
}

std::string local_address_towards(const std::string& host) {
  sockaddr_in a = resolve(host, 9, false);
  Fd fd(static_cast<int>(sys_check(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), "socket", host)));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    throw InputError(cat("no route to ", host, ": ", std::strerror(errno)));
  sockaddr_in mine{};
  socklen_t len = sizeof mine;
  sys_check(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&mine), &len), "getsockname", host);
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &mine.sin_addr, buf, sizeof buf);
  return buf;
}

Fd listen_tcp(const std::string& host, int port) {
  sockaddr_in a = resolve(host, port, true);
  Fd fd(static_cast<int>(
      sys_check(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), "socket", host)));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    throw InputError(cat("cannot listen on ", host, ":", port, ": ", std::strerror(errno),
                         errno == EADDRINUSE ? " (port taken: pick another)" : "",
                         errno == EADDRNOTAVAIL ? " (not an address of this machine)" : ""));
  sys_check(::listen(fd.get(), 1024), "listen", host);
  return fd;
}

int local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  sys_check(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), "getsockname", "listener");
  return ntohs(a.sin_port);
}

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) < 0) return "?";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return cat(buf, ":", ntohs(a.sin_port));
}

void tune_socket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

Fd connect_tcp(const std::string& host, int port, Deadline d, const std::string& who) {
  sockaddr_in a = resolve(host, port, false);
  std::string last = "no attempt";
  auto pause = milliseconds(1);
  for (;;) {
    Fd fd(static_cast<int>(sys_check(
        ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), "socket", who)));
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    if (rc < 0 && errno == EINPROGRESS) {
      if (wait_fd(fd.get(), POLLOUT, d)) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      tune_socket(fd.get());
      return fd;
    }
    last = std::strerror(errno);
    if (Clock::now() + pause >= d)
      throw TimeoutError(cat("cannot connect to ", who, " at ", host, ":", port, ": ", last,
                             " (is it running and reachable?)"),
                         -1);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(100));
  }
}

Fd accept_until(int listen_fd, Deadline d) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      tune_socket(fd);
      return Fd(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      sys_check(-1, "accept", "listener");
    if (!wait_fd(listen_fd, POLLIN, d)) return Fd();
  }
}

bool wait_fd(int fd, short events, Deadline d) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(remaining_ms(d)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) sys_check(-1, "poll", "socket");
    if (Clock::now() >= d) return false;
  }
}

void write_all(int fd, const void* data, size_t n, Deadline d, const std::string& who) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, d))
        throw TimeoutError(cat(who, " accepted no data before the deadline"), -1);
      continue;
    }
    throw PeerLostError(cat("lost connection to ", who, " while sending: ", std::strerror(errno)),
                        -1);
  }
}

void read_exact(int fd, void* data, size_t n, Deadline d, const std::string& who) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) throw PeerLostError(cat(who, " closed the connection"), -1);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, d))
        throw TimeoutError(cat(who, " sent nothing before the deadline"), -1);
      continue;
    }
    throw PeerLostError(cat("lost connection to ", who, ": ", std::strerror(errno)), -1);
  }
}

}  // namespace loom::comm::net
