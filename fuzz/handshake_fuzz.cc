// libFuzzer target: the connector's first handshake message (nonce, hello, MAC), which a
// listener parses from anyone who connects, before any authentication.
#include "comm/auth.h"

using namespace loom::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string nonce, hello_bytes, mac;
  auth::Hello hello;
  try {
    auth::parse_connect_message(in, nonce, hello, hello_bytes, mac);
  } catch (const CommError&) {
  }
  return 0;
}
