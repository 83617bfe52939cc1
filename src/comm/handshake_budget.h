// How many handshakes each source address may start (docs/security.md, "Rate limits"): at
// most `max_in_flight` at once and a token bucket of `burst` refilled at `per_second`.
// A connection over its address's budget is closed before a byte is read, so that a flood
// from one address cannot take the acceptor's threads, descriptors or time from the others;
// the ranks' connectors retry until their deadline. Also paces the log lines of refused
// handshakes, so that a flood cannot flood the log either.
// Thread-safety: every member is safe to call from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "loom/comm/comm.h"

namespace loom::comm {

struct HandshakeLimits {
  int max_in_flight = 16;
  double burst = 256;
  double per_second = 64;
};

class HandshakeBudget {
 public:
  explicit HandshakeBudget(HandshakeLimits limits = HandshakeLimits()) : limits_(limits) {}

  // Whether a connection from `address` may start a handshake now; when true, finish()
  // follows when it ends, whatever its outcome.
  bool admit(const std::string& address, Clock::time_point now = Clock::now());
  void finish(const std::string& address);

  // Counts a refusal (or drop) from `address` and returns how many to report in a log line
  // now: every one of the first few, then the count of the last 10 s at most once per 10 s;
  // 0 to stay quiet.
  int64_t to_log(const std::string& address, Clock::time_point now = Clock::now());

 private:
  struct Address {
    int in_flight = 0;
    double tokens = 0;
    Clock::time_point refilled{};
    int64_t refused = 0, unlogged = 0;
    Clock::time_point logged{};
  };
  Address& at(const std::string& address, Clock::time_point now);

  HandshakeLimits limits_;
  std::mutex mu_;
  std::map<std::string, Address> addresses_;
};

// The address part of "ip:port".
std::string host_of(const std::string& address);

}  // namespace loom::comm
