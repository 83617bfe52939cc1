#include "comm/rendezvous/kv_table.h"

#include <charconv>

#include "loom/core/error.h"

namespace loom::comm {

using store_protocol::Cmd;
using store_protocol::Response;
using store_protocol::Status;

std::optional<Response> KvTable::try_apply(const store_protocol::Request& r) {
  const std::string& key = r.keys.at(0);
  switch (r.cmd) {
    case Cmd::kSet: kv_[key] = r.value; return Response{};
    case Cmd::kGet: {
      auto it = kv_.find(key);
      if (it == kv_.end()) return std::nullopt;
      return Response{Status::kOk, it->second};
    }
    case Cmd::kTryGet: {
      auto it = kv_.find(key);
      if (it == kv_.end()) return Response{Status::kMissing, {}};
      return Response{Status::kOk, it->second};
    }
    case Cmd::kAdd: {
      int64_t v = 0;
      auto it = kv_.find(key);
      if (it != kv_.end()) {
        const std::string& s = it->second;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size())
          return Response{Status::kError, cat("add on key '", key, "' whose value is not an integer")};
      }
      v += r.delta;
      kv_[key] = std::to_string(v);
      return Response{Status::kOk, std::to_string(v)};
    }
    case Cmd::kWait:
      for (const auto& k : r.keys)
        if (kv_.find(k) == kv_.end()) return std::nullopt;
      return Response{};
    case Cmd::kCompareSet: {
      auto it = kv_.find(key);
      std::string current = it == kv_.end() ? std::string() : it->second;
      if (current == r.expected) {
        kv_[key] = r.value;
        return Response{Status::kOk, r.value};
      }
      return Response{Status::kOk, current};
    }
    case Cmd::kRemove: return Response{Status::kOk, kv_.erase(key) ? "1" : "0"};
  }
  return Response{Status::kError, "unknown command"};
}

}  // namespace loom::comm
