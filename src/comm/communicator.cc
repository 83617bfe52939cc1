// Communicator setup (links, shared window), issue-order execution, sticky failure.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator_impl.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kShmDirect: return "shm-direct";
    case Algorithm::kHierarchical: return "hierarchical";
  }
  return "?";
}

Algorithm algorithm_from_name(std::string_view name) {
  for (auto a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kShmDirect,
                 Algorithm::kHierarchical})
    if (algorithm_name(a) == name) return a;
  throw InputError(cat("unknown algorithm '", name,
                       "' (expected auto, ring, tree, shm-direct or hierarchical)"));
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {

// Topology from each rank's host id, then the shared windows it allows.
void place(Communicator::Impl& m, const std::vector<std::string>& ids) {
  Topology& topo = m.topo;
  std::vector<std::string> hosts;  // index = host, in order of each host's lowest rank
  for (int p = 0; p < m.size; ++p) {
    auto h = std::find(hosts.begin(), hosts.end(), ids[p]) - hosts.begin();
    if (h == static_cast<long>(hosts.size())) {
      hosts.push_back(ids[p]);
      topo.hosts.emplace_back();
    }
    topo.hosts[h].push_back(p);
    if (p == m.rank) topo.host = static_cast<int>(h);
  }
  m.local_ranks = topo.hosts[topo.host];
  const auto& local = m.local_ranks;
  const std::string& transport = m.config.transport;
  bool all_local = static_cast<int>(local.size()) == m.size;
  if (transport == "shm" && !all_local)
    throw InputError(cat("comm.transport = \"shm\" needs every rank on one host, but '", m.name, "' spans ",
                         topo.hosts.size(), " hosts (use auto or tcp)"));
  if (transport != "auto" && transport != "shm") return;
  Deadline d = Clock::now() + m.config.timeout;
  if (all_local && m.size > 1) {
    m.window = ShmWindow::create(*m.store, m.name, m.rank, m.size, m.config.shm_slot_bytes, d);
    topo.window = m.window.get();
    topo.window->set_check_fingerprints(m.config.check_fingerprints);
    topo.window->set_job_ranks(m.config.job_ranks);
  } else if (local.size() > 1) {
    int local_rank = static_cast<int>(std::find(local.begin(), local.end(), m.rank) - local.begin());
    m.host_window = ShmWindow::create(*m.store, cat(m.name, "/host", local[0]), local_rank,
                                      static_cast<int>(local.size()), m.config.shm_slot_bytes, d,
                                      local);
    topo.window = m.host_window.get();
    topo.window->set_check_fingerprints(m.config.check_fingerprints);
    topo.window->set_job_ranks(m.config.job_ranks);
  }
}

std::unique_ptr<Communicator::Impl> new_impl(Store& store, int rank, int size, const CommConfig& config,
                                             const std::string& name) {
  auto impl = std::make_unique<Communicator::Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->config = config;
  impl->name = name;
  impl->store = &store;
  impl->send_seq.assign(size, 0);
  impl->recv_seq.assign(size, 0);
  return impl;
}

}  // namespace

std::unique_ptr<Communicator> Communicator::create(Store& store, int rank, int size,
                                                   const CommConfig& config,
                                                   const std::string& name) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InputError(cat("rank ", rank, " is out of range for world size ", size));
  if (config.transport != "auto" && config.transport != "shm" && config.transport != "tcp" &&
      config.transport != "mpi")
    throw InputError(cat("comm.transport '", config.transport, "' is not available (expected auto, shm, tcp or mpi)"));
  if (config.timeout.count() <= 0)
    throw InputError(cat("comm.timeout_s must be positive, got ", config.timeout.count(), " ms"));
  auto impl = new_impl(store, rank, size, config, name);
  std::vector<std::string> ids;
  if (config.transport == "mpi") {
    impl->transport = make_mpi_transport(rank, size, config);
    ids = impl->transport->host_ids();
  } else {
    impl->transport = TcpMesh::connect(store, name, rank, size, config, impl->peers);
    for (const auto& p : impl->peers) ids.push_back(p.host_id);
  }
  place(*impl, ids);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

Communicator::~Communicator() {
  auto& m = *impl_;
  {
    std::unique_lock lock(m.mu);
    m.cv.wait(lock, [&] { return m.queue.empty() && !m.busy; });
    m.stopping = true;
  }
  m.cv.notify_all();
  if (m.progress.joinable()) m.progress.join();
  if (!m.failed) m.transport->goodbye(m.seq);
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
const CommConfig& Communicator::config() const { return impl_->config; }
const std::vector<int>& Communicator::local_ranks() const { return impl_->local_ranks; }

std::string Communicator::link_kind(int peer) const {
  LOOM_CHECK(peer >= 0 && peer < impl_->size);
  auto& m = *impl_;
  if (peer == m.rank) return "self";
  bool same_host = std::count(m.local_ranks.begin(), m.local_ranks.end(), peer) > 0;
  return m.topo.window && same_host ? "shm" : m.transport->link_kind(peer);
}

SharedBuffer Communicator::alloc_shared(size_t bytes) {
  auto& m = *impl_;
  SharedBuffer b;
  b.size_ = bytes;
  if (m.window) {
    auto region = m.window->share(*m.store, m.name, bytes, Clock::now() + m.config.timeout);
    b.data_ = ShmWindow::region_data(*region);
    b.shared_ = true;
    b.hold_ = std::move(region);
    return b;
  }
  const size_t page = 4096, rounded = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  void* p = std::aligned_alloc(page, rounded);
  if (!p) throw CommError(cat("rank ", m.config.job_rank(m.rank), " cannot allocate ", bytes, " bytes"), -1);
  std::memset(p, 0, rounded);
  b.data_ = static_cast<char*>(p);
  b.hold_ = std::shared_ptr<void>(p, std::free);
  return b;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  auto& m = *impl_;
  int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * m.size);
  Fingerprint fp = m.next_fp(OpKind::kSplit, DType::kI32, ReduceOp::kSum, -1, 2);
  auto gather = [&] {
    OpContext c{*m.transport, fp, m.config.timeout, m.scratch};
    if (m.window)
      shm_all_gather(c, *m.window, reinterpret_cast<char*>(mine), reinterpret_cast<char*>(all.data()), sizeof mine);
    else
      ring_all_gather(c, reinterpret_cast<char*>(mine), reinterpret_cast<char*>(all.data()), 2, DType::kI32);
  };
  m.run_blocking(FnRef(gather), fp, m.config.timeout);
  uint64_t index = m.splits++;
  std::string sub_name = cat(m.name, "/split", index, "/", color);
  if (m.config.transport == "mpi") {  // MPI makes the group; every rank takes part
    auto t = m.transport->split(color, key);
    if (!t) return nullptr;
    auto impl = new_impl(*m.store, t->rank(), t->size(), m.config, sub_name);
    impl->transport = std::move(t);
    place(*impl, impl->transport->host_ids());
    return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
  }
  if (color < 0) return nullptr;
  std::vector<std::pair<int, int>> members;  // (key, old rank)
  for (int p = 0; p < m.size; ++p)
    if (all[2 * p] == color) members.emplace_back(all[2 * p + 1], p);
  std::sort(members.begin(), members.end());
  int new_rank = static_cast<int>(
      std::find(members.begin(), members.end(), std::make_pair(key, m.rank)) - members.begin());
  CommConfig sub = m.config;
  sub.job_ranks.clear();
  for (const auto& [k, old_rank] : members) sub.job_ranks.push_back(m.config.job_rank(old_rank));
  return create(*m.store, new_rank, static_cast<int>(members.size()), sub, sub_name);
}

Work Communicator::Impl::submit_async(const Fingerprint& fp, std::function<void()> fn, bool p2p,
                                      milliseconds timeout) {
  auto op = std::make_shared<OpState>();
  op->fp = fp;
  op->run = std::move(fn);
  op->p2p = p2p;
  op->timeout = timeout;
  {
    std::lock_guard lock(mu);
    if (!progress.joinable()) progress = std::thread([this] { progress_loop(); });
    queue.push_back(op);
  }
  cv.notify_all();
  return Work(op);
}

void Communicator::Impl::run_blocking(FnRef fn, const Fingerprint& fp, milliseconds timeout, bool p2p) {
  // Only this (the caller's) thread starts the progress thread; without one nothing can
  // be queued, and the lock is skipped.
  if (progress.joinable()) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return queue.empty() && !busy; });
  }
  if (auto error = run_op(fn, fp, timeout, p2p, nullptr)) std::rethrow_exception(error);
}

void Communicator::Impl::record_flight(const Fingerprint& fp, const std::exception_ptr& error) {
  const uint64_t i = flights.load(std::memory_order_relaxed);
  Flight& f = flight[i % kFlightRecords];
  f.head.store(static_cast<uint64_t>(fp.kind) | static_cast<uint64_t>(fp.dtype) << 8 | static_cast<uint64_t>(fp.op) << 16 |
                   static_cast<uint64_t>(static_cast<uint32_t>(fp.root)) << 32,
               std::memory_order_relaxed);
  f.count.store(fp.count, std::memory_order_relaxed);
  f.seq.store(fp.seq, std::memory_order_relaxed);
  if (error) {  // rare: the failure path may take a lock and format
    std::string what = what_of(error);
    std::lock_guard lock(flight_mu);
    flight_errors[i] = std::move(what);
  }
  flights.store(i + 1, std::memory_order_release);
}

std::vector<Communicator::FlightRecord> Communicator::flight_record() const {
  const Impl& m = *impl_;
  std::vector<FlightRecord> out;
  const uint64_t n = m.flights.load(std::memory_order_acquire);
  for (uint64_t i = n > kFlightRecords ? n - kFlightRecords : 0; i < n; ++i) {
    const Impl::Flight& f = m.flight[i % kFlightRecords];
    const uint64_t head = f.head.load(std::memory_order_relaxed);
    const Fingerprint fp{.kind = static_cast<OpKind>(head & 0xff), .dtype = static_cast<DType>((head >> 8) & 0xff),
                         .op = static_cast<ReduceOp>((head >> 16) & 0xff), .root = static_cast<int32_t>(head >> 32),
                         .count = f.count.load(std::memory_order_relaxed), .seq = f.seq.load(std::memory_order_relaxed)};
    std::string error;
    {
      std::lock_guard lock(m.flight_mu);
      if (auto it = m.flight_errors.find(i); it != m.flight_errors.end()) error = it->second;
    }
    out.push_back({fp.seq, fp.describe(), error.empty() ? "completed" : "failed", error});
  }
  std::lock_guard lock(impl_->mu);  // (impl_ is not const here: the queue's lock is taken)
  for (const auto& op : impl_->queue) out.push_back({op->fp.seq, op->fp.describe(), "queued or running", ""});
  return out;
}

std::exception_ptr Communicator::Impl::run_op(FnRef fn, const Fingerprint& fp, milliseconds timeout,
                                              bool p2p, std::function<void()> stall) {
  std::exception_ptr error = failed;
  if (error) return error;
  try {
    fn();
    if (p2p) {
      transport->on_stall = std::move(stall);
      transport->wait_all(timeout, fp);
    }
  } catch (const CommError& e) {
    transport->abort(e);
    error = std::current_exception();
  } catch (...) {
    error = std::current_exception();
  }
  transport->on_stall = nullptr;
  if (error) failed = error;
  record_flight(fp, error);
  return error;
}

size_t Communicator::Impl::execute(const std::shared_ptr<OpState>& first) {
  std::vector<std::shared_ptr<OpState>> joined;  // send/recv ops batched behind `first`
  first->started = std::chrono::steady_clock::now();
  // Queued send/recv ops right behind this one join the batch as they come.
  auto stall = [&] {
    std::vector<std::shared_ptr<OpState>> more;
    {
      std::lock_guard lock(mu);
      for (size_t i = 1 + joined.size(); i < queue.size() && queue[i]->p2p; ++i)
        more.push_back(queue[i]);
    }
    for (auto& op : more) {
      op->started = std::chrono::steady_clock::now();
      op->run();
      joined.push_back(op);
    }
  };
  std::exception_ptr error = run_op(FnRef(first->run), first->fp, first->timeout, first->p2p,
                                    first->p2p ? std::function<void()>(stall) : nullptr);
  const auto now = std::chrono::steady_clock::now();
  auto complete = [&](OpState& op) {
    std::lock_guard lock(op.mu);
    op.finished = now;
    op.error = error;
    op.done = true;
    op.cv.notify_all();
  };
  complete(*first);
  for (auto& op : joined) complete(*op);
  return 1 + joined.size();
}

void Communicator::Impl::progress_loop() {
  std::unique_lock lock(mu);
  for (;;) {
    cv.wait(lock, [&] { return stopping || !queue.empty(); });
    if (queue.empty()) return;
    auto op = queue.front();
    busy = true;
    lock.unlock();
    size_t ran = execute(op);
    lock.lock();
    queue.erase(queue.begin(), queue.begin() + static_cast<long>(ran));
    busy = false;
    cv.notify_all();
  }
}

Work::~Work() {
  if (state_) {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
  }
}

void Work::wait(Deadline deadline) {
  if (!state_) return;
  std::unique_lock lock(state_->mu);
  auto finished = [&] { return state_->done; };
  if (deadline == Deadline::max())
    state_->cv.wait(lock, finished);
  else if (!state_->cv.wait_until(lock, deadline, finished))
    throw TimeoutError(cat(state_->fp.describe(), " did not complete by the caller's deadline"), -1);
  if (state_->error) std::rethrow_exception(state_->error);
}

std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point> Work::span() const {
  LOOM_CHECK(state_ != nullptr);
  std::lock_guard lock(state_->mu);
  LOOM_CHECK(state_->done);
  return {state_->started, state_->finished};
}

bool Work::done() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

}  // namespace loom::comm
