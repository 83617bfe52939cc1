// TcpStore frames (docs/formats.md, "Rendezvous store"): every frame is a u32 length then
// the body. Request body: u8 command, u32 timeout_ms, then the command's fields (strings
// are u32 length + bytes). Response body: u8 status, then a string payload.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::comm::store_protocol {

enum class Cmd : uint8_t { kSet = 1, kGet, kAdd, kWait, kCompareSet, kRemove, kTryGet };
enum class Status : uint8_t { kOk = 0, kTimeout, kMissing, kError };

constexpr size_t kMaxKey = 4096;
constexpr size_t kMaxValue = 64u << 20;
constexpr size_t kMaxKeys = 4096;
constexpr size_t kMaxFrame = kMaxValue * 2 + 65536;

struct Request {
  Cmd cmd = Cmd::kGet;
  uint32_t timeout_ms = 0;
  std::vector<std::string> keys;  // one, or many for kWait
  std::string value;              // kSet, kCompareSet (desired)
  std::string expected;           // kCompareSet
  int64_t delta = 0;              // kAdd
};

std::string encode_request(const Request& r);
// CommError on anything malformed: unknown command, length over a cap, trailing bytes.
Request parse_request(std::string_view body);

struct Response {
  Status status = Status::kOk;
  std::string payload;
};
std::string encode_response(const Response& r);
Response parse_response(std::string_view body);

}  // namespace loom::comm::store_protocol
