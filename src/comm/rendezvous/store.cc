#include <condition_variable>
#include <mutex>

#include "comm/rendezvous/kv_table.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {

using store_protocol::Cmd;
using store_protocol::Request;
using store_protocol::Response;
using store_protocol::Status;

namespace {

uint32_t timeout_ms(Deadline d) {
  auto now = Clock::now();
  if (d <= now) return 0;
  auto ms = std::chrono::duration_cast<milliseconds>(d - now).count();
  return static_cast<uint32_t>(std::min<int64_t>(ms, 0x7fffffff));
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 4; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 4) out += cat(" and ", keys.size() - 4, " more");
  return out;
}

Response checked(Response r, const std::vector<std::string>& keys) {
  switch (r.status) {
    case Status::kOk:
    case Status::kMissing: return r;
    case Status::kTimeout:
      throw TimeoutError(cat("store: timed out waiting for key ", key_list(keys)), -1);
    case Status::kError: break;
  }
  throw CommError(cat("store: ", r.payload), -1);
}

}  // namespace

void KeyValueStore::set(const std::string& key, const std::string& value, Deadline d) {
  checked(call(Request{.cmd = Cmd::kSet, .timeout_ms = timeout_ms(d), .keys = {key}, .value = value}, d),
          {key});
}

std::string KeyValueStore::get(const std::string& key, Deadline d) {
  return checked(call(Request{.cmd = Cmd::kGet, .timeout_ms = timeout_ms(d), .keys = {key}}, d), {key})
      .payload;
}

int64_t KeyValueStore::add(const std::string& key, int64_t delta, Deadline d) {
  auto r = checked(
      call(Request{.cmd = Cmd::kAdd, .timeout_ms = timeout_ms(d), .keys = {key}, .delta = delta}, d),
      {key});
  return std::stoll(r.payload);
}

void KeyValueStore::wait(const std::vector<std::string>& keys, Deadline d) {
  if (keys.empty()) return;
  checked(call(Request{.cmd = Cmd::kWait, .timeout_ms = timeout_ms(d), .keys = keys}, d), keys);
}

std::string KeyValueStore::compare_set(const std::string& key, const std::string& expected,
                                       const std::string& desired, Deadline d) {
  return checked(call(Request{.cmd = Cmd::kCompareSet,
                              .timeout_ms = timeout_ms(d),
                              .keys = {key},
                              .value = desired,
                              .expected = expected},
                      d),
                 {key})
      .payload;
}

bool KeyValueStore::remove(const std::string& key, Deadline d) {
  return checked(call(Request{.cmd = Cmd::kRemove, .timeout_ms = timeout_ms(d), .keys = {key}}, d),
                 {key})
             .payload == "1";
}

std::optional<std::string> KeyValueStore::try_get(const std::string& key, Deadline d) {
  auto r = checked(call(Request{.cmd = Cmd::kTryGet, .timeout_ms = timeout_ms(d), .keys = {key}}, d),
                   {key});
  if (r.status == Status::kMissing) return std::nullopt;
  return r.payload;
}

struct HashStore::State {
  std::mutex mu;
  std::condition_variable changed;
  KvTable table;
};

HashStore::HashStore() : s_(std::make_unique<State>()) {}
HashStore::~HashStore() = default;

Response HashStore::call(const Request& r, Deadline d) {
  std::unique_lock lock(s_->mu);
  for (;;) {
    if (auto out = s_->table.try_apply(r)) {
      if (r.cmd != Cmd::kGet && r.cmd != Cmd::kTryGet && r.cmd != Cmd::kWait)
        s_->changed.notify_all();
      return *out;
    }
    if (s_->changed.wait_until(lock, d) == std::cv_status::timeout && !s_->table.try_apply(r))
      return Response{Status::kTimeout, {}};
  }
}

}  // namespace loom::comm
