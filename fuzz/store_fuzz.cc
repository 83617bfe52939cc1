// libFuzzer target: the rendezvous store's request and response parsers (the bytes any
// client or server can send before anything is trusted). Properties: no crash, no read
// past the input, no allocation over the caps; and whatever parses re-encodes to bytes
// that parse to the same message.
#include <cstdlib>

#include "comm/rendezvous/store_protocol.h"
#include "loom/comm/comm.h"

using namespace loom::comm;
using namespace loom::comm::store_protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    Request r = parse_request(in);
    Request again = parse_request(encode_request(r));
    if (again.cmd != r.cmd || again.keys != r.keys || again.value != r.value ||
        again.expected != r.expected || again.delta != r.delta || again.timeout_ms != r.timeout_ms)
      std::abort();
  } catch (const CommError&) {
  }
  try {
    Response r = parse_response(in);
    Response again = parse_response(encode_response(r));
    if (again.status != r.status || again.payload != r.payload) std::abort();
  } catch (const CommError&) {
  }
  return 0;
}
