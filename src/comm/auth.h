// Mutual HMAC-SHA256 challenge-response on a fresh connection, before anything else is
// read from it. Both sides prove they hold the per-job secret without sending it:
//   acceptor -> connector: magic, version, nonce_a (32 random bytes)
//   connector -> acceptor: magic, version, nonce_c, hello, HMAC(secret, "loom-connector" |
//                          nonce_a | nonce_c | hello)
//   acceptor -> connector: status (0 ok, else a one-line reason) and, when ok,
//                          HMAC(secret, "loom-acceptor" | nonce_c | nonce_a | hello)
// `hello` says who connects (job id, purpose, rank, world size); it is covered by the MAC
// so it cannot be altered. Messages are capped at 4 KiB. docs/formats.md has the bytes.
// Thread-safety: reentrant.
#pragma once

#include <string>

#include "loom/comm/comm.h"

namespace loom::comm::auth {

// A connector that did not prove it holds the secret (wrong MAC), or that does not speak
// the handshake at all. The acceptor logs it and drops the connection; it is never the
// job's business (docs/security.md): someone without the secret cannot act on a job.
class Unauthenticated : public AuthError {
 public:
  using AuthError::AuthError;
};

// How long an acceptor gives one connection to complete its handshake.
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);

struct Hello {
  std::string job_id;
  std::string purpose;  // "store", or the communicator's name
  int32_t rank = -1;
  int32_t size = 0;
};

std::string hmac_sha256(std::string_view key, std::string_view message);  // 32 raw bytes
std::string random_bytes(size_t n);
std::string hex(std::string_view bytes);  // lowercase, two digits per byte

// Connector side: throws AuthError naming `who` and the acceptor's reason.
void connect_handshake(int fd, const std::string& secret, const Hello& mine, Deadline d,
                       const std::string& who);

// Acceptor side. Returns the verified hello, or throws (after telling the connector):
// Unauthenticated when the MAC is wrong, AuthError with the reason when `check` rejects a
// verified hello (`check` returns an empty string to accept, else the reason), CommError
// when the bytes are not a handshake or do not arrive in time.
template <typename F>
Hello accept_handshake(int fd, const std::string& secret, Deadline d, F&& check);

// Non-template core of accept_handshake.
struct AcceptResult {
  Hello hello;
  bool mac_ok = false;
};
AcceptResult accept_read(int fd, const std::string& secret, Deadline d, std::string& nonce_a,
                         std::string& nonce_c, std::string& hello_bytes);
void accept_reply(int fd, const std::string& secret, const std::string& reason,
                  const std::string& nonce_a, const std::string& nonce_c,
                  const std::string& hello_bytes, Deadline d);

// Parses a connector's message (exposed for the fuzzer).
void parse_connect_message(std::string_view msg, std::string& nonce_c, Hello& hello,
                           std::string& hello_bytes, std::string& mac);

template <typename F>
Hello accept_handshake(int fd, const std::string& secret, Deadline d, F&& check) {
  std::string nonce_a, nonce_c, hello_bytes;
  AcceptResult r = accept_read(fd, secret, d, nonce_a, nonce_c, hello_bytes);
  if (!r.mac_ok) {
    const std::string reason = "authentication failed: wrong secret";
    accept_reply(fd, secret, reason, nonce_a, nonce_c, hello_bytes, d);
    // What the hello claims is unverified: quoted for the log, never trusted.
    throw Unauthenticated(cat(reason, " (the hello claims ", r.hello.purpose, " rank ", r.hello.rank, " of job '",
                              r.hello.job_id, "')"),
                          -1);
  }
  const std::string reason = check(r.hello);
  accept_reply(fd, secret, reason, nonce_a, nonce_c, hello_bytes, d);
  if (!reason.empty()) throw AuthError(reason, r.hello.rank);
  return r.hello;
}

}  // namespace loom::comm::auth
