// Sockets with deadlines: checked wrappers that name the call, the address and the cause
// (STYLE.md rule 10). Every fd made here is non-blocking, close-on-exec and owned by an
// Fd. Blocking-style helpers (read_exact, write_all) poll with the deadline and throw
// PeerLostError on EOF/reset and TimeoutError when the deadline passes.
// Thread-safety: functions are reentrant; an Fd is used by one thread at a time.
#pragma once

#include <string>

#include "loom/comm/comm.h"

namespace loom::comm::net {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release();
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

bool is_loopback(const std::string& host);
// The address of this machine that packets to `host` leave from (a routing lookup; no
// packet is sent). InputError when `host` is unreachable.
std::string local_address_towards(const std::string& host);
// Listens on host:port (port 0 picks one). InputError when the address is not an IPv4
// address of this machine or the port is taken.
Fd listen_tcp(const std::string& host, int port);
int local_port(int fd);
std::string peer_address(int fd);  // "a.b.c.d:port"
// Connects, retrying refused connections until `d` (the listener may not be up yet).
Fd connect_tcp(const std::string& host, int port, Deadline d, const std::string& who);
// Accepts one connection, or returns an empty Fd when `d` passes.
Fd accept_until(int listen_fd, Deadline d);
void tune_socket(int fd);  // TCP_NODELAY and large buffers

// `who` names the other side in errors ("rank 3", "store 127.0.0.1:29500").
void write_all(int fd, const void* data, size_t n, Deadline d, const std::string& who);
void read_exact(int fd, void* data, size_t n, Deadline d, const std::string& who);
// Waits until fd is readable/writable; false when `d` passes.
bool wait_fd(int fd, short events, Deadline d);

}  // namespace loom::comm::net
