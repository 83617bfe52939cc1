#include "comm/rendezvous/store_protocol.h"

#include "comm/wire.h"

namespace loom::comm::store_protocol {

std::string encode_request(const Request& r) {
  wire::Writer w;
  w.put<uint8_t>(static_cast<uint8_t>(r.cmd)).put<uint32_t>(r.timeout_ms);
  switch (r.cmd) {
    case Cmd::kWait:
      w.put<uint32_t>(static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) w.str(k);
      break;
    case Cmd::kSet: w.str(r.keys.at(0)).str(r.value); break;
    case Cmd::kAdd: w.str(r.keys.at(0)).put<int64_t>(r.delta); break;
    case Cmd::kCompareSet: w.str(r.keys.at(0)).str(r.expected).str(r.value); break;
    case Cmd::kGet:
    case Cmd::kRemove:
    case Cmd::kTryGet: w.str(r.keys.at(0)); break;
  }
  return w.take();
}

Request parse_request(std::string_view body) {
  wire::Reader rd(body, "store request");
  Request r;
  auto cmd = rd.get<uint8_t>();
  if (cmd < 1 || cmd > static_cast<uint8_t>(Cmd::kTryGet)) rd.fail(cat("unknown command ", int(cmd)));
  r.cmd = static_cast<Cmd>(cmd);
  r.timeout_ms = rd.get<uint32_t>();
  auto key = [&] { r.keys.emplace_back(rd.str(kMaxKey)); };
  switch (r.cmd) {
    case Cmd::kWait: {
      auto n = rd.get<uint32_t>();
      if (n == 0 || n > kMaxKeys) rd.fail(cat("wait on ", n, " keys (1..", kMaxKeys, " allowed)"));
      for (uint32_t i = 0; i < n; ++i) key();
      break;
    }
    case Cmd::kSet:
      key();
      r.value = std::string(rd.str(kMaxValue));
      break;
    case Cmd::kAdd:
      key();
      r.delta = rd.get<int64_t>();
      break;
    case Cmd::kCompareSet:
      key();
      r.expected = std::string(rd.str(kMaxValue));
      r.value = std::string(rd.str(kMaxValue));
      break;
    case Cmd::kGet:
    case Cmd::kRemove:
    case Cmd::kTryGet: key(); break;
  }
  rd.finish();
  return r;
}

std::string encode_response(const Response& r) {
  wire::Writer w;
  w.put<uint8_t>(static_cast<uint8_t>(r.status)).str(r.payload);
  return w.take();
}

Response parse_response(std::string_view body) {
  wire::Reader rd(body, "store response");
  Response r;
  auto s = rd.get<uint8_t>();
  if (s > static_cast<uint8_t>(Status::kError)) rd.fail(cat("unknown status ", int(s)));
  r.status = static_cast<Status>(s);
  r.payload = std::string(rd.str(kMaxValue));
  rd.finish();
  return r;
}

}  // namespace loom::comm::store_protocol
