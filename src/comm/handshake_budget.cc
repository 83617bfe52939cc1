#include "comm/handshake_budget.h"

#include <algorithm>
#include <utility>

namespace loom::comm {
namespace {
constexpr int64_t kLoggedEach = 5;        // refusals logged one by one per address
constexpr auto kLogEvery = std::chrono::seconds(10);
constexpr size_t kMaxAddresses = 4096;    // idle entries are forgotten beyond this
}  // namespace

HandshakeBudget::Address& HandshakeBudget::at(const std::string& address, Clock::time_point now) {
  if (addresses_.size() >= kMaxAddresses && !addresses_.count(address))
    std::erase_if(addresses_, [](const auto& kv) { return kv.second.in_flight == 0; });
  auto [it, fresh] = addresses_.try_emplace(address);
  Address& a = it->second;
  if (fresh) {
    a.tokens = limits_.burst;
    a.refilled = now;
  }
  const double elapsed = std::chrono::duration<double>(now - a.refilled).count();
  a.tokens = std::min(limits_.burst, a.tokens + std::max(0.0, elapsed) * limits_.per_second);
  a.refilled = now;
  return a;
}

bool HandshakeBudget::admit(const std::string& address, Clock::time_point now) {
  std::lock_guard lock(mu_);
  Address& a = at(address, now);
  if (a.in_flight >= limits_.max_in_flight || a.tokens < 1) return false;
  a.tokens -= 1;
  ++a.in_flight;
  return true;
}

void HandshakeBudget::finish(const std::string& address) {
  std::lock_guard lock(mu_);
  auto it = addresses_.find(address);
  if (it != addresses_.end() && it->second.in_flight > 0) --it->second.in_flight;
}

int64_t HandshakeBudget::to_log(const std::string& address, Clock::time_point now) {
  std::lock_guard lock(mu_);
  Address& a = at(address, now);
  ++a.unlogged;
  if (++a.refused <= kLoggedEach || now - a.logged >= kLogEvery) {
    a.logged = now;
    return std::exchange(a.unlogged, 0);
  }
  return 0;
}

std::string host_of(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace loom::comm
