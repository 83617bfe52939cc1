// The mpi transport (docs/algorithms.md, "mpi"): Loom's algorithms over MPI point-to-point
// for reductions (fixed order, bf16/f16 with f32 accumulation, as on every transport),
// and MPI's own nonblocking collectives for pure data movement (broadcast, all_gather,
// all_to_all, gather, scatter, barrier), where OpenMPI's shared-memory single-copy paths
// are hard to beat.
//
// The never-a-silent-hang contract holds here too: every wait is a test loop with the
// op's timeout; a message carries its op's fingerprint in a 24-byte header message
// before the payload (same tag, so MPI's non-overtaking order pairs them); native
// collectives are preceded by an all_gather of fingerprints; and an aborting rank sends
// its error to every peer on a tag of its own, which waits probe for. A dead process is
// MPI's to report: mpirun ends the job.
// Thread-safety: MPI initialized with MPI_THREAD_MULTIPLE; one thread per communicator.
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/transport/tcp/tcp_mesh.h"
#include "comm/transport/transport.h"

namespace loom::comm {
namespace {

constexpr int kDataTag = 1;
constexpr int kAbortTag = 2;
constexpr size_t kMaxAbortText = 4096;
constexpr size_t kHostIdBytes = 256;
static_assert(sizeof(Fingerprint) == 24);

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(cat(call, " failed: ", text), -1);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) return;
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
    if (provided < MPI_THREAD_MULTIPLE)
      throw InputError("comm.transport = \"mpi\": this MPI library lacks MPI_THREAD_MULTIPLE, which "
                       "async ops on a progress thread need");
  });
}

class MpiTransport : public Transport, public NativeCollectives {
 public:
  explicit MpiTransport(MPI_Comm comm, bool check) : comm_(comm), check_(check) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& r : aborts_) MPI_Request_free(&r);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string link_kind(int) const override { return "mpi"; }

  void isend(int peer, const Fingerprint& fp, const void* data, size_t bytes) override {
    if (check_) post(MPI_Isend(&fp, sizeof fp, MPI_BYTE, peer, kDataTag, comm_, next(peer, nullptr)));
    post_chunks(peer, const_cast<void*>(data), bytes, true);
  }

  void irecv(int peer, const Fingerprint& fp, void* data, size_t bytes) override {
    if (check_) {
      headers_.push_back({fp, {}, peer});
      post(MPI_Irecv(&headers_.back().got, sizeof(Fingerprint), MPI_BYTE, peer, kDataTag, comm_,
                     next(peer, &headers_.back())));
    }
    post_chunks(peer, data, bytes, false);
  }

  void wait_all(milliseconds timeout, const Fingerprint& cur) override {
    try {
      wait_requests(timeout, cur);
    } catch (...) {
      cancel_all();
      throw;
    }
    pending_.clear();
    headers_.clear();
  }

  void abort(const CommError& why) override {
    std::string text = std::string(why.what()).substr(0, kMaxAbortText);
    abort_text_ = cat(static_cast<int>(error_kind_of(why)), " ", why.peer(), " ", text);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      aborts_.emplace_back();
      MPI_Isend(abort_text_.data(), static_cast<int>(abort_text_.size()), MPI_CHAR, p, kAbortTag, comm_,
                &aborts_.back());
    }
  }

  // A peer's abort message, if one came: rethrown here with its type.
  void check_peers(const Fingerprint&) override {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, comm_, &flag, &st);
    if (!flag) return;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(std::min<size_t>(std::max(n, 0), kMaxAbortText + 64), '\0');
    MPI_Recv(text.data(), static_cast<int>(text.size()), MPI_CHAR, st.MPI_SOURCE, kAbortTag, comm_,
             MPI_STATUS_IGNORE);
    int kind = 0, peer = -1, used = 0;
    std::sscanf(text.c_str(), "%d %d %n", &kind, &peer, &used);
    throw_comm_error(static_cast<ErrorKind>(kind), cat(text.substr(used), " (relayed by rank ", st.MPI_SOURCE, ")"),
                     peer);
  }

  void heartbeat() override {}
  std::vector<int> blame(const std::vector<int>& suspects, milliseconds) override { return suspects; }
  void goodbye(uint64_t) override {}
  NativeCollectives* native() override { return this; }

  std::unique_ptr<Transport> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiTransport>(sub, check_);
  }

  std::vector<std::string> host_ids() override {
    std::string mine = this_host_id();
    mine.resize(kHostIdBytes, '\0');
    std::string all(kHostIdBytes * size_, '\0');
    check_mpi(MPI_Allgather(mine.data(), kHostIdBytes, MPI_CHAR, all.data(), kHostIdBytes, MPI_CHAR, comm_),
              "MPI_Allgather");
    std::vector<std::string> ids;
    for (int p = 0; p < size_; ++p) ids.push_back(all.substr(p * kHostIdBytes, kHostIdBytes));
    return ids;
  }

  // ---- native collectives ----
  void broadcast(const Fingerprint& fp, milliseconds timeout, char* buf, size_t bytes, int root) override {
    agree(fp, timeout);
    for_chunks(bytes, [&](size_t off, int n) {
      post(MPI_Ibcast(buf + off, n, MPI_BYTE, root, comm_, next(-1, nullptr)));
      wait_all(timeout, fp);
    });
  }
  void all_gather(const Fingerprint& fp, milliseconds timeout, const char* in, char* out,
                  size_t block_bytes) override {
    agree(fp, timeout);
    const void* src = in == out + rank_ * block_bytes ? MPI_IN_PLACE : in;
    post(MPI_Iallgather(src, count_of(block_bytes), MPI_BYTE, out, count_of(block_bytes), MPI_BYTE, comm_,
                        next(-1, nullptr)));
    wait_all(timeout, fp);
  }
  void all_to_all(const Fingerprint& fp, milliseconds timeout, const char* in, char* out,
                  size_t block_bytes) override {
    agree(fp, timeout);
    const void* src = in == out ? MPI_IN_PLACE : in;
    post(MPI_Ialltoall(src, count_of(block_bytes), MPI_BYTE, out, count_of(block_bytes), MPI_BYTE, comm_,
                       next(-1, nullptr)));
    wait_all(timeout, fp);
  }
  void gather(const Fingerprint& fp, milliseconds timeout, const char* in, char* out, size_t block_bytes,
              int root) override {
    agree(fp, timeout);
    const void* src = rank_ == root && in == out + root * block_bytes ? MPI_IN_PLACE : in;
    post(MPI_Igather(src, count_of(block_bytes), MPI_BYTE, out, count_of(block_bytes), MPI_BYTE, root, comm_,
                     next(-1, nullptr)));
    wait_all(timeout, fp);
  }
  void scatter(const Fingerprint& fp, milliseconds timeout, const char* in, char* out, size_t block_bytes,
               int root) override {
    agree(fp, timeout);
    void* dst = rank_ == root && out == in + root * block_bytes ? MPI_IN_PLACE : out;
    post(MPI_Iscatter(in, count_of(block_bytes), MPI_BYTE, dst, count_of(block_bytes), MPI_BYTE, root, comm_,
                      next(-1, nullptr)));
    wait_all(timeout, fp);
  }
  void barrier(const Fingerprint& fp, milliseconds timeout) override {
    agree(fp, timeout);
    if (!check_) {  // the all-pairs fingerprint exchange above already synchronized
      post(MPI_Ibarrier(comm_, next(-1, nullptr)));
      wait_all(timeout, fp);
    }
  }

 private:
  struct Header {
    Fingerprint want, got;
    int peer;
  };
  struct Pending {
    int peer;         // -1: a collective
    Header* header;   // set for a fingerprint receive
  };

  static int count_of(size_t bytes) {
    if (bytes > static_cast<size_t>(INT32_MAX))
      throw InputError(cat("mpi transport: a block of ", bytes, " bytes is over MPI's 2 GiB count limit"));
    return static_cast<int>(bytes);
  }

  // Calls body(offset, count) for pieces of at most 1 GiB (MPI counts are ints).
  template <typename Body>
  static void for_chunks(size_t bytes, Body body) {
    constexpr size_t kMax = size_t{1} << 30;
    if (bytes == 0) return body(size_t{0}, 0);
    for (size_t off = 0; off < bytes; off += kMax) body(off, static_cast<int>(std::min(kMax, bytes - off)));
  }

  void post_chunks(int peer, void* data, size_t bytes, bool send) {
    for_chunks(bytes, [&](size_t off, int n) {
      char* p = static_cast<char*>(data) + off;
      if (send)
        post(MPI_Isend(p, n, MPI_BYTE, peer, kDataTag, comm_, next(peer, nullptr)));
      else
        post(MPI_Irecv(p, n, MPI_BYTE, peer, kDataTag, comm_, next(peer, nullptr)));
    });
  }

  MPI_Request* next(int peer, Header* h) {
    requests_.push_back(MPI_REQUEST_NULL);
    pending_.push_back({peer, h});
    return &requests_.back();
  }
  void post(int rc) { check_mpi(rc, "posting an MPI request"); }

  // Every rank shows its fingerprint to every other before a native collective, over
  // the same point-to-point channel the Loom algorithms use, so a rank in a native
  // collective and one in a Loom algorithm see each other's call and both fail at once.
  void agree(const Fingerprint& fp, milliseconds timeout) {
    if (!check_) return;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      isend(p, fp, nullptr, 0);
      irecv(p, fp, nullptr, 0);
    }
    wait_all(timeout, fp);
  }

  void wait_requests(milliseconds timeout, const Fingerprint& cur) {
    auto last_progress = Clock::now();
    size_t left = requests_.size();
    std::vector<int> done(requests_.size());
    while (left > 0) {
      int n = 0;
      int rc = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &n, done.data(),
                            MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        check_headers();  // a truncated payload is most likely a mismatched call
        check_mpi(rc, cat("MPI_Testsome in ", cur.describe()).c_str());
      }
      if (n == MPI_UNDEFINED) break;
      if (n > 0) {
        left -= n;
        last_progress = Clock::now();
        for (int i = 0; i < n; ++i)
          if (Header* h = pending_[done[i]].header) check_header(*h);
        continue;
      }
      check_peers(cur);
      if (on_stall) {
        on_stall();  // may post more requests
        done.resize(requests_.size());
        left = 0;
        for (auto r : requests_) left += r != MPI_REQUEST_NULL;
      }
      if (Clock::now() - last_progress >= timeout) {
        int who = -1;
        for (size_t i = 0; i < requests_.size() && who < 0; ++i)
          if (requests_[i] != MPI_REQUEST_NULL) who = pending_[i].peer;
        std::string silent = who >= 0 ? cat("rank ", who) : std::string("a rank of this group");
        throw TimeoutError(cat(silent, " moved no data for ", timeout.count(), " ms while this rank (rank ", rank_,
                               ") is in ", cur.describe(), " (stopped, hung, or in another op)"),
                           who);
      }
      std::this_thread::yield();
    }
    requests_.clear();
  }

  void check_header(const Header& h) const {
    if (!h.got.matches(h.want))
      throw MismatchError(cat("mismatched collectives: this rank (rank ", rank_, ") called ", h.want.describe(),
                              " but rank ", h.peer, " called ", h.got.describe()),
                          h.peer);
  }
  void check_headers() const {
    for (size_t i = 0; i < pending_.size(); ++i)
      if (pending_[i].header && requests_[i] == MPI_REQUEST_NULL) check_header(*pending_[i].header);
  }

  // Point-to-point requests are cancelled; a collective's cannot be (MPI forbids it)
  // and is left to MPI: the communicator is unusable after an error anyway.
  void cancel_all() {
    for (size_t i = 0; i < requests_.size(); ++i)
      if (requests_[i] != MPI_REQUEST_NULL && pending_[i].peer >= 0) {
        MPI_Cancel(&requests_[i]);
        MPI_Request_free(&requests_[i]);
      }
    requests_.clear();
    pending_.clear();
    headers_.clear();
  }

  MPI_Comm comm_;
  bool check_;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> requests_;
  std::vector<Pending> pending_;
  std::deque<Header> headers_;  // stable addresses for receives in flight
  std::vector<MPI_Request> aborts_;
  std::string abort_text_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(int rank, int size, const CommConfig& config) {
  ensure_initialized();
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_rank != rank || world_size != size)
    throw InputError(cat("comm.transport = \"mpi\": this process is MPI rank ", world_rank, " of ", world_size,
                         " but was asked to be rank ", rank, " of ", size, " (start it with mpirun -np ", size, ")"));
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  return std::make_unique<MpiTransport>(dup, config.check_fingerprints);
}

}  // namespace loom::comm
