#include "comm/transport/shm/shm_window.h"

#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "comm/auth.h"
#include "comm/copy.h"
#include "comm/transport/transport.h"
#include "loom/core/host.h"

namespace loom::comm {

// A rank's control block. Everything a reader of round r needs from its poster sits in
// one cache line, post[r % kPosts]: the round number it spins on, the fingerprint it
// checks, and, for rounds of at most kInlineBytes, the data itself; a small round then
// costs each reader one line from the poster's cache. The other counters live apart, so
// writing them does not take the post line away from its readers.
struct alignas(128) ShmWindow::Control {
  std::atomic<uint64_t> counter[2];  // kReduced, kDone
  uint8_t pad0[128 - 2 * sizeof(std::atomic<uint64_t>)];
  struct alignas(64) Post {
    std::atomic<uint64_t> round;  // the kPosted counter of the rounds posting in this line
    uint8_t kind, dtype, op, pad;
    int32_t root;
    uint64_t count, seq;
    char data[ShmWindow::kInlineBytes];  // rounds of at most kInlineBytes
  } post[ShmWindow::kPosts];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(ShmWindow::Control::Post) == 64, "a post is one cache line");

namespace {

constexpr uint64_t kSegmentMagic = 0x314d48534d4f4f4cull;  // "LOOMSHM1"
constexpr size_t kHeader = 4096;
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// A shared segment's name: this process and 8 random bytes.
std::string segment_name() {
  std::string tag;
  for (unsigned char c : auth::random_bytes(8)) tag += cat(std::hex, int(c));
  return cat("/loom-", ::getpid(), "-", tag);
}

// fill(): copies below this size stay in cache and always use ordinary stores.
constexpr size_t kFillMeasuredBytes = 64 << 10;
// Every this many large fills, the store kind not in use is tried again, so a change of
// placement (or of the machine's load) is noticed within that many rounds. Each try of
// the worse kind costs its round a little; at 16 the tries cost np=2 reduce_scatter a few
// percent.
constexpr uint64_t kFillProbeEvery = 64;
// Streaming wins only when ordinary stores cost this much more: it sends every byte to
// memory, so the peers' reads of the slot miss the cache (np=2 all_gather at 64 MiB: the
// copy-out took 6.1-7.7 ms a call after streaming fills against 4.6-5.5 after ordinary
// ones, about 1.3x).
constexpr double kStreamingPenalty = 1.5;
// A decider's rounds stream their slices only when ordinary stores cost this much more: the
// costs are whole rounds, measured where the bytes are read, so a small margin only keeps
// the pick from flapping on noise.
constexpr double kSliceMargin = 1.1;
// Where a round's slice kind sits in the decider's post line: past place()'s 16 bytes.
constexpr size_t kSliceModeByte = 16;
static_assert(kSliceModeByte < ShmWindow::kInlineBytes);

}  // namespace

std::unique_ptr<ShmWindow> ShmWindow::create(Store& store, const std::string& name, int rank,
                                             int size, size_t slot_bytes, Deadline d,
                                             std::vector<int> ranks) {
  std::unique_ptr<ShmWindow> w(new ShmWindow);
  w->rank_ = rank;
  w->size_ = size;
  if (ranks.empty())
    for (int r = 0; r < size; ++r) ranks.push_back(r);
  LOOM_CHECK(static_cast<int>(ranks.size()) == size);
  w->ranks_ = std::move(ranks);
  w->posted_.assign(size, 0);
  w->slot_bytes_ = align_up(std::max<size_t>(slot_bytes, 4096), 4096);
  size_t control_bytes = align_up(sizeof(Control) * size, 4096);
  w->map_bytes_ = kHeader + control_bytes + kSlots * w->slot_bytes_ * size;
  // Spinning only pays when every rank has a core; oversubscribed, the rank being waited
  // for may need this very core, so yield almost at once.
  w->spin_limit_ = size > available_cores() ? 8 : 2000;
  std::string key = name + "/shm";
  std::string path;
  int fd = -1;
  if (rank == 0) {
    path = segment_name();
    fd = static_cast<int>(sys_check(::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600),
                                    "shm_open", path));
    if (::ftruncate(fd, static_cast<off_t>(w->map_bytes_)) < 0) {
      ::close(fd);
      ::shm_unlink(path.c_str());
      sys_check(-1, "ftruncate", cat(path, " (", w->map_bytes_, " bytes; is /dev/shm big enough?)"));
    }
    store.set(key, path, d);
  } else {
    path = store.get(key, d);
    fd = static_cast<int>(sys_check(::shm_open(path.c_str(), O_RDWR, 0600), "shm_open", path));
  }
  void* p = ::mmap(nullptr, w->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    if (rank == 0) ::shm_unlink(path.c_str());
    sys_check(-1, "mmap", path);
  }
  w->base_ = static_cast<char*>(p);
  w->control_ = reinterpret_cast<Control*>(w->base_ + kHeader);
  w->slots_ = w->base_ + kHeader + control_bytes;
  if (rank == 0) {
    std::memcpy(w->base_, &kSegmentMagic, sizeof kSegmentMagic);  // fresh pages are zero
  }
  // Everyone mapped: the name is no longer needed.
  store.add(name + "/shm_mapped", 1, d);
  if (rank == 0) {
    for (;;) {
      if (std::stoll(store.get(name + "/shm_mapped", d)) >= size) break;
      if (Clock::now() >= d) {
        ::shm_unlink(path.c_str());
        throw TimeoutError(cat("not every rank of '", name, "' mapped the shared segment in time"), -1);
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
    ::shm_unlink(path.c_str());
  }
  return w;
}

struct ShmWindow::Region {
  int me = 0;
  std::vector<char*> base;    // per window rank: where this rank maps that rank's part
  std::vector<size_t> bytes;  // and how many bytes of it
  ~Region() {
    for (size_t i = 0; i < base.size(); ++i)
      if (base[i]) ::munmap(base[i], bytes[i]);
  }
};

char* ShmWindow::region_data(const Region& r) { return r.base[r.me]; }

std::shared_ptr<ShmWindow::Region> ShmWindow::share(Store& store, const std::string& name,
                                                    size_t bytes, Deadline d) {
  uint64_t id;
  {
    // The id is taken even if the call fails (on every rank alike), so that the next
    // call's keys in the store are fresh.
    std::lock_guard<std::mutex> lock(regions_mu_);
    regions_.emplace_back();
    id = regions_.size();
  }
  auto r = std::make_shared<Region>();
  r->me = rank_;
  r->base.assign(size_, nullptr);
  r->bytes.assign(size_, 0);
  const std::string key = cat(name, "/shared", id);
  const std::string path = segment_name();
  const size_t mine = align_up(std::max<size_t>(bytes, 1), 4096);
  // Reserved in full now, so that a /dev/shm too small fails here and not as a SIGBUS at
  // the first touch of a page.
  int fd = static_cast<int>(sys_check(::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600),
                                      "shm_open", path));
  int err = ::ftruncate(fd, static_cast<off_t>(mine)) < 0 ? errno : ::posix_fallocate(fd, 0, static_cast<off_t>(mine));
  void* p = err ? MAP_FAILED : ::mmap(nullptr, mine, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!err && p == MAP_FAILED) err = errno;
  ::close(fd);
  struct Unlink {
    const std::string& path;
    ~Unlink() { ::shm_unlink(path.c_str()); }
  } unlink{path};
  if (!err) {
    r->base[rank_] = static_cast<char*>(p);
    r->bytes[rank_] = mine;
  }
  // Every rank learns whether every other got its part, so that all fail alike (and a
  // caller can fall back to ordinary memory everywhere) instead of some waiting in vain.
  store.set(cat(key, "/", rank_),
            err ? cat("error rank ", job(rank_), " cannot share ", bytes, " bytes in /dev/shm (",
                      std::strerror(err), "); is /dev/shm big enough?")
                : cat("ok ", mine, " ", path),
            d);
  std::vector<std::string> parts(size_);
  for (int q = 0; q < size_; ++q) parts[q] = store.get(cat(key, "/", q), d);
  for (const auto& v : parts)
    if (v.rfind("error ", 0) == 0) throw CommError(v.substr(6), -1);
  // Peers only read this rank's part, and this rank theirs.
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    std::istringstream in(parts[q].substr(3));
    size_t n = 0;
    std::string theirs;
    in >> n >> theirs;
    int qfd = static_cast<int>(sys_check(::shm_open(theirs.c_str(), O_RDONLY, 0), "shm_open", theirs));
    void* q_map = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, qfd, 0);
    ::close(qfd);
    if (q_map == MAP_FAILED) sys_check(-1, "mmap", theirs);
    r->base[q] = static_cast<char*>(q_map);
    r->bytes[q] = n;
  }
  // Every rank mapped every part: the names (unlinked on return) are no longer needed.
  store.add(key + "/mapped", 1, d);
  while (std::stoll(store.get(key + "/mapped", d)) < size_) {
    if (Clock::now() >= d)
      throw TimeoutError(cat("not every rank of '", name, "' mapped shared buffer #", id, " in time"), -1);
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::lock_guard<std::mutex> lock(regions_mu_);
  regions_[id - 1] = r;
  any_regions_.store(true, std::memory_order_release);
  return r;
}

bool ShmWindow::place(uint64_t round, const void* src, size_t bytes) {
  if (bytes <= kInlineBytes) return false;
  uint64_t where[2] = {0, 0};  // region id (0: none) and offset in this rank's part
  if (bytes >= kPlacedMinBytes && any_regions_.load(std::memory_order_acquire)) {
    const auto s = reinterpret_cast<uintptr_t>(src);
    std::lock_guard<std::mutex> lock(regions_mu_);
    for (size_t i = 0; i < regions_.size() && where[0] == 0; ++i) {
      auto r = regions_[i].lock();
      if (!r) continue;
      const auto b = reinterpret_cast<uintptr_t>(r->base[rank_]);
      if (s >= b && s + bytes <= b + r->bytes[rank_]) where[0] = i + 1, where[1] = s - b;
    }
  }
  std::memcpy(control_[rank_].post[round % kPosts].data, where, sizeof where);
  return where[0] != 0;
}

const char* ShmWindow::placed(int peer, uint64_t round, size_t bytes) const {
  uint64_t where[2];
  std::memcpy(where, control_[peer].post[round % kPosts].data, sizeof where);
  if (where[0] == 0) return nullptr;
  std::shared_ptr<Region> r;
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    if (where[0] <= regions_.size()) r = regions_[where[0] - 1].lock();
  }
  if (!r || where[1] + bytes > r->bytes[peer])
    throw CommError(cat("rank ", job(peer), " posted its input in shared buffer #", where[0],
                        ", which this rank (rank ", job(rank_),
                        ") has released or never allocated (every rank must allocate and release "
                        "shared buffers alike)"),
                    ranks_[peer]);
  return r->base[peer] + where[1];
}

const char* ShmWindow::input(int peer, uint64_t round, size_t bytes) const {
  const char* p = bytes > kInlineBytes ? placed(peer, round, bytes) : nullptr;
  return p ? p : data(peer, round, bytes);
}

ShmWindow::~ShmWindow() {
  if (base_) ::munmap(base_, map_bytes_);
}

char* ShmWindow::slot(int rank, uint64_t round) const {
  return slots_ + (static_cast<size_t>(rank) * kSlots + round % kSlots) * slot_bytes_;
}

int ShmWindow::fill_mode(bool also) const {
  const double* cost = fill_cost_[also];
  return cost[1] > 0 && cost[0] > kStreamingPenalty * cost[1] ? 1 : 0;
}

void ShmWindow::fill(void* dst, const void* src, size_t n, void* also, bool stream_also) {
  if (n < kFillMeasuredBytes) {
    copy_bytes(dst, src, n);
    if (also) copy_bytes(also, src, n);
    return;
  }
  int mode = fill_mode(also != nullptr);
  if (++fills_ % kFillProbeEvery == 0) mode = 1 - mode;
  auto t0 = Clock::now();
  if (also) {
    tee_copy(dst, also, src, n, mode == 1, stream_also);
  } else if (mode) {
    stream_copy(dst, src, n);
  } else {
    copy_bytes(dst, src, n);
  }
  double cost = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
  double& avg = fill_cost_[also != nullptr][mode];
  avg = avg == 0 ? cost : 0.75 * avg + 0.25 * cost;
}

int ShmWindow::choose_slice_mode() {
  if (forced_slice_mode_ >= 0) return forced_slice_mode_;
  const int mode = slice_cost_[1] > 0 && slice_cost_[0] > kSliceMargin * slice_cost_[1] ? 1 : 0;
  return ++slices_ % kFillProbeEvery == 0 ? 1 - mode : mode;
}

void ShmWindow::post_slice_mode(uint64_t round, int mode) {
  control_[rank_].post[round % kPosts].data[kSliceModeByte] = static_cast<char>(mode);
}

int ShmWindow::slice_mode(int peer, uint64_t round) const {
  return control_[peer].post[round % kPosts].data[kSliceModeByte] == 1 ? 1 : 0;
}

void ShmWindow::note_slice_cost(int mode, double ns_per_byte) {
  double& avg = slice_cost_[mode];
  avg = avg == 0 ? ns_per_byte : 0.75 * avg + 0.25 * ns_per_byte;
}

char* ShmWindow::data(int rank, uint64_t round, size_t bytes) const {
  if (bytes <= kInlineBytes) return control_[rank].post[round % kPosts].data;
  return slot(rank, round);
}

std::atomic<uint64_t>& ShmWindow::counter(int rank, Counter c, uint64_t round) const {
  if (c == kPosted) return control_[rank].post[round % kPosts].round;
  return control_[rank].counter[c - 1];
}

void ShmWindow::publish(Counter c, uint64_t round, const Fingerprint* fp) {
  Control& me = control_[rank_];
  if (fp) {
    LOOM_CHECK(c == kPosted);
    auto& s = me.post[round % kPosts];
    s.kind = static_cast<uint8_t>(fp->kind);
    s.dtype = static_cast<uint8_t>(fp->dtype);
    s.op = static_cast<uint8_t>(fp->op);
    s.root = fp->root;
    s.count = fp->count;
    s.seq = fp->seq;
  }
  counter(rank_, c, round).store(round, std::memory_order_release);
}

void ShmWindow::wait_slot_free(uint64_t round, size_t bytes, Transport& t, const Fingerprint& cur,
                               milliseconds timeout) {
  // Done with the round `depth` back means done with the last user of this post line
  // and, for a round that uses the slot, of the slot (kPosts is a multiple of kSlots).
  const uint64_t depth = bytes > kInlineBytes ? kSlots : kPosts;
  if (round <= depth) return;
  const uint64_t last = round - depth;
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && posted_[p] <= last) wait(p, kDone, last, t, cur, timeout);
}

void ShmWindow::wait(int peer, Counter c, uint64_t round, Transport& t, const Fingerprint& cur,
                     milliseconds timeout) {
  const auto& counter = this->counter(peer, c, round);
  if (counter.load(std::memory_order_acquire) < round) {
    // The clock starts when spinning gives way to yielding: reading it costs as much as a
    // small op's whole wait (the timeout is milliseconds; the spin, microseconds).
    Deadline start{}, next_check{};
    // Past 10 ms the wait is for a slow peer (a straggler, a parameter server's round),
    // not for bytes in flight: it sleeps in short naps instead of yielding, so that
    // waiting ranks leave the cores to the ranks they wait for.
    bool patient = false;
    for (uint64_t spins = 1;; ++spins) {
      if (counter.load(std::memory_order_acquire) >= round) break;
      if (spins < spin_limit_) {
        _mm_pause();
        continue;
      }
      if (spins == spin_limit_) {
        start = Clock::now();
        next_check = start + milliseconds(1);
      }
      if (patient) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else ::sched_yield();
      if ((spins & 15) == 0) {
        auto now = Clock::now();
        if (now >= next_check) {
          patient = now - start >= milliseconds(10);
          t.check_peers(cur);
          next_check = now + milliseconds(1);
          if (now - start >= timeout / 4) t.heartbeat();
          if (now - start >= timeout) {
            auto culprits = t.blame({ranks_[peer]}, timeout);
            t.check_peers(cur);  // an abort from a rank that knows more wins
            if (counter.load(std::memory_order_acquire) >= round) break;
            std::string who;
            for (int p : culprits) who += (who.empty() ? "rank " : ", rank ") + std::to_string(p);
            throw TimeoutError(cat(who, " made no progress for ", timeout.count(),
                                   " ms while this rank (rank ", job(rank_), ") is in ", cur.describe(),
                                   " (stopped, hung, or in another op)"),
                               culprits.front());
          }
        }
      }
    }
  }
  if (c != kPosted) return;
  if (check_fingerprints_) {
    const auto& s = control_[peer].post[round % kPosts];
    Fingerprint theirs{static_cast<OpKind>(s.kind), static_cast<DType>(s.dtype),
                       static_cast<ReduceOp>(s.op), s.root, s.count, s.seq};
    if (!theirs.matches(cur))
      throw MismatchError(cat("mismatched collectives: this rank (rank ", job(rank_), ") called ",
                              cur.describe(), " but rank ", job(peer), " called ", theirs.describe()),
                          ranks_[peer]);
  }
  // A rank posts a round only once it is done with every earlier one: wait_slot_free()
  // need not read its kDone counter for those.
  posted_[peer] = std::max(posted_[peer], round);
}

void ShmWindow::wait_all(Counter c, uint64_t round, Transport& t, const Fingerprint& cur,
                         milliseconds timeout) {
  for (int p = 0; p < size_; ++p)
    if (p != rank_) wait(p, c, round, t, cur, timeout);
}

}  // namespace loom::comm
