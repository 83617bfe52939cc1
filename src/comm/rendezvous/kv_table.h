// The store's semantics in one place, shared by HashStore and the TcpStore server:
// apply a request to the table, or say it must wait (a get or wait on a missing key).
// Thread-safety: none; callers lock.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "comm/rendezvous/store_protocol.h"

namespace loom::comm {

class KvTable {
 public:
  // nullopt: the request blocks until a later mutation (retry it then).
  std::optional<store_protocol::Response> try_apply(const store_protocol::Request& r);

 private:
  std::map<std::string, std::string, std::less<>> kv_;
};

}  // namespace loom::comm
