// A Transport over a subset of another transport's ranks: view rank i is parent rank
// `members[i]`. Hierarchical algorithms run the ordinary ring and tree code over views
// (the ranks of one host, or one rank per host) without new links. Errors keep naming
// parent ranks, which are the communicator's ranks the user knows.
// Thread-safety: as the parent (one thread at a time).
#pragma once

#include <algorithm>
#include <vector>

#include "comm/transport/transport.h"

namespace loom::comm {

class GroupView : public Transport {
 public:
  // REQUIRES: `members` holds distinct parent ranks including parent.rank().
  GroupView(Transport& parent, std::vector<int> members) : parent_(parent), members_(std::move(members)) {
    rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), parent.rank()) - members_.begin());
    LOOM_CHECK(rank_ < static_cast<int>(members_.size()));
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string link_kind(int peer) const override { return parent_.link_kind(members_[peer]); }
  void isend(int peer, const Fingerprint& fp, const void* data, size_t bytes) override {
    parent_.isend(members_[peer], fp, data, bytes);
  }
  void irecv(int peer, const Fingerprint& fp, void* data, size_t bytes) override {
    parent_.irecv(members_[peer], fp, data, bytes);
  }
  void wait_all(milliseconds timeout, const Fingerprint& current) override {
    parent_.wait_all(timeout, current);
  }
  void abort(const CommError& why) override { parent_.abort(why); }
  void check_peers(const Fingerprint& current) override { parent_.check_peers(current); }
  void heartbeat() override { parent_.heartbeat(); }
  // Suspects are parent ranks already (the errors name them).
  std::vector<int> blame(const std::vector<int>& suspects, milliseconds timeout) override {
    return parent_.blame(suspects, timeout);
  }
  void goodbye(uint64_t) override {}

 private:
  Transport& parent_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace loom::comm
