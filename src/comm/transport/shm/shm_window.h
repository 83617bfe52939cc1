// The shm transport: one shared-memory segment per same-host communicator, holding for
// every rank a control block (round counters, and kPosts post lines carrying each
// round's fingerprint and, when small, its data) and kSlots staging slots. shm-direct
// algorithms copy into their own slot, publish a round number, and read peers' slots
// directly: one copy in, one copy out, no messages. Inputs in shared regions (share())
// skip the copy in: the post names them and peers read them in place.
//
// Rounds are numbered per communicator and advance identically on every rank; slot
// round % kSlots holds round `round`. A rank reuses a slot only after every rank is done
// with the round that last used it. Waits spin briefly, then yield (ranks may outnumber
// cores), and every millisecond ask the transport whether a peer died or aborted.
//
// The segment is unlinked as soon as every rank has mapped it, so a crash leaves nothing
// behind in /dev/shm.
// Thread-safety: one thread per rank; ranks synchronize through the counters.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/copy.h"
#include "comm/op.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {

class Transport;

class ShmWindow {
 public:
  // Every rank of a same-host group calls this; rank 0 creates the segment and names it
  // in the store under "<name>/shm". `ranks[i]` is window rank i's rank in the
  // transport that waits pass in (for blame and error text); empty means the same.
  static std::unique_ptr<ShmWindow> create(Store& store, const std::string& name, int rank,
                                           int size, size_t slot_bytes, Deadline d,
                                           std::vector<int> ranks = {});
  ~ShmWindow();

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  char* slot(int rank, uint64_t round) const;
  // Where a rank's `bytes` of data for `round` lie: inline in the line peers read the
  // round's post from when they fit in kInlineBytes, else its slot. Every rank of a round
  // passes the same `bytes` (the fingerprint is checked before any data is read).
  char* data(int rank, uint64_t round, size_t bytes) const;
  static constexpr size_t kInlineBytes = 32;

  // Rounds in flight per rank: round r uses slot r % kSlots, and reuses it only once
  // round r - kSlots is done everywhere.
  static constexpr int kSlots = 2;
  // Post lines per rank (round r posts in line r % kPosts). A round whose data is inline
  // (or absent) reuses only its post line, so a poster
  // may run up to kPosts rounds ahead of its slowest reader: a broadcast root that need
  // not wait for receivers every second round, which matters when ranks share cores.
  static constexpr int kPosts = 16;
  static_assert(kPosts % kSlots == 0);

  enum Counter { kPosted = 0, kReduced = 1, kDone = 2 };

  // Copies n bytes into this rank's own slot (dst lies in it). Large copies pick, per
  // rank and from measurement, between ordinary stores and non-temporal ones: when the
  // peers that read the slot sit on another cache die, overwriting lines they hold costs
  // a cross-die invalidation each and ordinary stores crawl (docs/algorithms.md, "Slot
  // stores"); streaming stores bypass that at the price of peers reading from memory.
  // Either way the bytes are the same, so ranks need not agree.
  // With `also`, the same bytes go there too in the same pass (ordinary stores, or
  // streaming ones when stream_also), timed apart from fills without it.
  void fill(void* dst, const void* src, size_t n, void* also = nullptr, bool stream_also = false);
  // Which store fill() would use now for its slot, in fills with a second destination
  // (`also`) or without: 0 ordinary, 1 streaming (tests, benchmarks).
  int fill_mode(bool also = false) const;
  // How all_reduce's and reduce's ranks store the slices they reduce into their slots for
  // peers to copy out (docs/algorithms.md, "Reduced slices"): 0 ordinary stores, which leave a
  // slice in the writer's cache, or 1 streaming ones, which send it to memory. Which costs
  // less depends on where the ranks' cores sit and changes while a job runs, so one rank of
  // the op (the decider) picks a kind each round from what its rounds cost in each, its
  // reduce and its copies out together, tries the other kind every 64th round, and posts its
  // pick; every rank stores in the kind the decider posted, so the decider's copies measure it.
  int choose_slice_mode();                           // the decider, before it posts a round
  void post_slice_mode(uint64_t round, int mode);    // the decider, before publish(kPosted)
  int slice_mode(int peer, uint64_t round) const;    // after wait(kPosted) on the decider
  void note_slice_cost(int mode, double ns_per_byte);  // the decider, after its round
  // Tests: every choice is `mode` from now on (-1: measured again).
  void force_slice_mode(int mode) { forced_slice_mode_ = mode; }

  // Publishes this rank's counter (release). kPosted also records `fp` for the slot.
  void publish(Counter c, uint64_t round, const Fingerprint* fp = nullptr);

  // Off: waits skip the fingerprint compare (CommConfig::check_fingerprints).
  void set_check_fingerprints(bool on) { check_fingerprints_ = on; }
  // How errors name ranks: the job rank of each transport rank (CommConfig::job_ranks).
  void set_job_ranks(std::vector<int> job_ranks) { job_ranks_ = std::move(job_ranks); }
  // Waits until `peer`'s counter reaches `round` (acquire). For kPosted, checks the
  // peer's fingerprint against `cur` (MismatchError naming both calls).
  void wait(int peer, Counter c, uint64_t round, Transport& t, const Fingerprint& cur,
            milliseconds timeout);
  void wait_all(Counter c, uint64_t round, Transport& t, const Fingerprint& cur,
                milliseconds timeout);
  // Before this rank posts `round`, which puts `bytes` in data(): waits until every peer
  // is done with the rounds that last used its post line and, if the data does not fit
  // inline, its slot. A peer seen to post a later round is known to be, so ops where
  // every rank waits for every other skip the kDone reads.
  void wait_slot_free(uint64_t round, size_t bytes, Transport& t, const Fingerprint& cur,
                      milliseconds timeout);

  uint64_t next_round() { return ++round_; }

  // ---- Shared inputs (docs/algorithms.md, "Shared inputs") ----
  // A region: for every rank of the window, memory of that rank's that every rank maps.
  // It lives while anyone holds it (the buffer that share() returns), not the window.
  struct Region;
  // Collective over the window, every rank in the same order (sizes may differ): maps
  // `bytes` of fresh shared memory of this rank's (zeroed, page-aligned) and every peer's
  // share of the same call. Throws CommError naming /dev/shm when it cannot hold them.
  std::shared_ptr<Region> share(Store& store, const std::string& name, size_t bytes, Deadline d);
  static char* region_data(const Region& r);  // this rank's part
  // Before posting `round` (ops whose readers call input()): when [src, src + bytes) lies
  // in this rank's part of a live region and is at least kPlacedMinBytes, names it in the
  // round's post and returns true: peers read it in place, the caller skips the fill and,
  // before its op returns, waits for every peer's kDone of its last round (its input is
  // the caller's again then). Else false: the caller fills data() as usual.
  bool place(uint64_t round, const void* src, size_t bytes);
  static constexpr size_t kPlacedMinBytes = 64 << 10;
  // After wait(kPosted) on `round`, in a round whose data is not inline: where `peer`
  // placed its input (place()), of which the caller reads up to `bytes`; nullptr when it
  // filled its slot instead. Throws CommError when the region is not (or no longer) here.
  const char* placed(int peer, uint64_t round, size_t bytes) const;
  // Where `peer`'s `bytes` for `round` lie: in place, or data(). After wait(kPosted).
  const char* input(int peer, uint64_t round, size_t bytes) const;

  struct Control;

 private:
  // The counter `c` of `rank` for `round` (kPosted lives in the round's post line).
  std::atomic<uint64_t>& counter(int rank, Counter c, uint64_t round) const;
  ShmWindow() = default;
  int rank_ = 0, size_ = 0;
  size_t slot_bytes_ = 0;
  size_t map_bytes_ = 0;
  char* base_ = nullptr;
  Control* control_ = nullptr;
  char* slots_ = nullptr;
  uint64_t round_ = 0;
  uint64_t spin_limit_ = 2000;  // pause-loop iterations before yielding
  std::vector<int> ranks_;      // transport rank of each window rank
  std::vector<int> job_ranks_;  // the job rank of each transport rank (empty: the same), for messages
  int job(int window_rank) const {
    const int t = ranks_[window_rank];
    return t < static_cast<int>(job_ranks_.size()) ? job_ranks_[t] : t;
  }
  std::vector<uint64_t> posted_;  // per rank: the latest round it was seen to post
  bool check_fingerprints_ = true;
  // Recent ns per byte of each store kind, [with `also`][kind]; 0 = not yet measured.
  double fill_cost_[2][2] = {{0, 0}, {0, 0}};
  uint64_t fills_ = 0;            // large fills so far
  // Recent ns per byte of a decider's rounds with slices in each kind; 0 = not yet measured.
  double slice_cost_[2] = {0, 0};
  uint64_t slices_ = 0;  // rounds decided so far
  int forced_slice_mode_ = -1;
  // The regions shared so far, by id (1, 2, ...); the user's thread adds, the op's reads.
  mutable std::mutex regions_mu_;
  std::vector<std::weak_ptr<Region>> regions_;
  std::atomic<bool> any_regions_{false};
};

}  // namespace loom::comm
