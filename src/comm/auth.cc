#include "comm/auth.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "comm/net.h"
#include "comm/wire.h"

namespace loom::comm::auth {
namespace {

constexpr uint32_t kMagic = 0x4d4f4f4c;  // "LOOM"
constexpr uint16_t kVersion = 1;
constexpr size_t kNonce = 32;
constexpr uint32_t kMaxMessage = 4096;

void send_msg(int fd, const std::string& body, Deadline d, const std::string& who) {
  wire::Writer w;
  w.put<uint32_t>(static_cast<uint32_t>(body.size())).raw(body);
  net::write_all(fd, w.bytes().data(), w.bytes().size(), d, who);
}

std::string recv_msg(int fd, Deadline d, const std::string& who) {
  uint32_t n = 0;
  net::read_exact(fd, &n, sizeof n, d, who);
  if (n > kMaxMessage)
    throw CommError(cat("handshake from ", who, " announced ", n, " bytes (cap ", kMaxMessage,
                        "): not a Loom peer"),
                    -1);
  std::string body(n, '\0');
  net::read_exact(fd, body.data(), n, d, who);
  return body;
}

std::string encode_hello(const Hello& h) {
  wire::Writer w;
  w.str(h.job_id).str(h.purpose).put<int32_t>(h.rank).put<int32_t>(h.size);
  return w.take();
}

}  // namespace

std::string hmac_sha256(std::string_view key, std::string_view message) {
  unsigned char md[32];
  unsigned int len = 0;
  LOOM_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                  reinterpret_cast<const unsigned char*>(message.data()), message.size(), md,
                  &len) != nullptr);
  return std::string(reinterpret_cast<char*>(md), len);
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    throw RuntimeError("RAND_bytes failed: the OS random source is unavailable");
  return out;
}

std::string hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (const char b : bytes) {
    const auto c = static_cast<unsigned char>(b);
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

void parse_connect_message(std::string_view msg, std::string& nonce_c, Hello& hello,
                           std::string& hello_bytes, std::string& mac) {
  wire::Reader r(msg, "handshake");
  if (r.get<uint32_t>() != kMagic) r.fail("bad magic: not a Loom peer");
  auto version = r.get<uint16_t>();
  if (version != kVersion) r.fail(cat("protocol version ", version, ", expected ", kVersion));
  nonce_c = std::string(r.raw(kNonce));
  auto hb = r.str(1024);
  hello_bytes = std::string(hb);
  mac = std::string(r.raw(32));
  r.finish();
  wire::Reader h(hb, "handshake hello");
  hello.job_id = std::string(h.str(256));
  hello.purpose = std::string(h.str(256));
  hello.rank = h.get<int32_t>();
  hello.size = h.get<int32_t>();
  h.finish();
}

void connect_handshake(int fd, const std::string& secret, const Hello& mine, Deadline d,
                       const std::string& who) {
  std::string challenge_bytes = recv_msg(fd, d, who);
  wire::Reader r(challenge_bytes, cat("handshake challenge from ", who));
  if (r.get<uint32_t>() != kMagic) r.fail("bad magic: not a Loom peer");
  if (r.get<uint16_t>() != kVersion) r.fail("protocol version differs");
  std::string nonce_a(r.raw(kNonce));
  r.finish();

  std::string nonce_c = random_bytes(kNonce);
  std::string hello = encode_hello(mine);
  std::string mac = hmac_sha256(secret, "loom-connector" + nonce_a + nonce_c + hello);
  wire::Writer w;
  w.put<uint32_t>(kMagic).put<uint16_t>(kVersion).raw(nonce_c).str(hello).raw(mac);
  send_msg(fd, w.bytes(), d, who);

  std::string reply = recv_msg(fd, d, who);
  wire::Reader rr(reply, cat("handshake reply from ", who));
  auto status = rr.get<uint8_t>();
  if (status != 0)
    throw AuthError(cat(who, " refused this rank: ", rr.str(1024)), -1);
  std::string their_mac(rr.raw(32));
  rr.finish();
  std::string expect = hmac_sha256(secret, "loom-acceptor" + nonce_c + nonce_a + hello);
  if (CRYPTO_memcmp(expect.data(), their_mac.data(), 32) != 0)
    throw AuthError(cat(who, " failed authentication: it does not hold this job's secret"), -1);
}

AcceptResult accept_read(int fd, const std::string& secret, Deadline d, std::string& nonce_a,
                         std::string& nonce_c, std::string& hello_bytes) {
  std::string who = cat("connection from ", net::peer_address(fd));
  nonce_a = random_bytes(kNonce);
  wire::Writer w;
  w.put<uint32_t>(kMagic).put<uint16_t>(kVersion).raw(nonce_a);
  send_msg(fd, w.bytes(), d, who);
  AcceptResult out;
  std::string mac;
  parse_connect_message(recv_msg(fd, d, who), nonce_c, out.hello, hello_bytes, mac);
  std::string expect = hmac_sha256(secret, "loom-connector" + nonce_a + nonce_c + hello_bytes);
  out.mac_ok = CRYPTO_memcmp(expect.data(), mac.data(), 32) == 0;
  return out;
}

void accept_reply(int fd, const std::string& secret, const std::string& reason,
                  const std::string& nonce_a, const std::string& nonce_c,
                  const std::string& hello_bytes, Deadline d) {
  wire::Writer w;
  if (reason.empty())
    w.put<uint8_t>(0).raw(hmac_sha256(secret, "loom-acceptor" + nonce_c + nonce_a + hello_bytes));
  else
    w.put<uint8_t>(1).str(reason.substr(0, 1000));
  send_msg(fd, w.bytes(), d, cat("connection from ", net::peer_address(fd)));
}

}  // namespace loom::comm::auth
