// Communicator setup (links, shared window), issue-order execution, sticky failure.
#include <algorithm>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator_impl.h"
#include "loom/rendezvous.h"

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

std::unique_ptr<Communicator> Communicator::create(Store& store, int rank, int size,
                                                   const CommConfig& config,
                                                   const std::string& name) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InputError(cat("rank ", rank, " is out of range for world size ", size));
  if (config.transport != "auto" && config.transport != "shm" && config.transport != "tcp")
    throw InputError(cat("comm.transport '", config.transport, "' is not available (expected auto, shm or tcp",
                         config.transport == "mpi" ? "; this build has no MPI transport" : "", ")"));
  if (config.timeout.count() <= 0)
    throw InputError(cat("comm.timeout_s must be positive, got ", config.timeout.count(), " ms"));
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->config = config;
  impl->name = name;
  impl->store = &store;
  impl->send_seq.assign(size, 0);
  impl->recv_seq.assign(size, 0);
  impl->transport = TcpMesh::connect(store, name, rank, size, config, impl->peers);
  Topology& topo = impl->topo;
  std::vector<std::string> host_ids;  // index = host, in order of each host's lowest rank
  for (int p = 0; p < size; ++p) {
    auto h = std::find(host_ids.begin(), host_ids.end(), impl->peers[p].host_id) - host_ids.begin();
    if (h == static_cast<long>(host_ids.size())) {
      host_ids.push_back(impl->peers[p].host_id);
      topo.hosts.emplace_back();
    }
    topo.hosts[h].push_back(p);
    if (p == rank) topo.host = static_cast<int>(h);
  }
  impl->local_ranks = topo.hosts[topo.host];
  bool all_local = static_cast<int>(impl->local_ranks.size()) == size;
  if (config.transport == "shm" && !all_local)
    throw InputError(cat("comm.transport = \"shm\" needs every rank on one host, but '", name, "' spans ",
                         size - static_cast<int>(impl->local_ranks.size()) + 1,
                         "+ hosts (use auto or tcp)"));
  const auto& local = impl->local_ranks;
  if (all_local && size > 1 && config.transport != "tcp") {
    impl->window = ShmWindow::create(store, name, rank, size, config.shm_slot_bytes,
                                     Clock::now() + config.timeout);
    topo.window = impl->window.get();
  } else if (local.size() > 1 && config.transport != "tcp") {
    int local_rank = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
    impl->host_window = ShmWindow::create(store, cat(name, "/host", local[0]), local_rank,
                                          static_cast<int>(local.size()), config.shm_slot_bytes,
                                          Clock::now() + config.timeout, local);
    topo.window = impl->host_window.get();
  }
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
  return m.topo.window && same_host ? "shm" : "tcp";
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  auto& m = *impl_;
  int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * m.size);
  Fingerprint fp = m.next_fp(OpKind::kSplit, DType::kI32, ReduceOp::kSum, -1, 2);
  m.submit(fp, [&] {
    OpContext c{*m.transport, fp, m.config.timeout, m.scratch};
    if (m.window)
      shm_all_gather(c, *m.window, reinterpret_cast<char*>(mine), reinterpret_cast<char*>(all.data()), sizeof mine);
    else
      ring_all_gather(c, reinterpret_cast<char*>(mine), reinterpret_cast<char*>(all.data()), 2, DType::kI32);
  }, false);
  uint64_t index = m.splits++;
  if (color < 0) return nullptr;
  std::vector<std::pair<int, int>> members;  // (key, old rank)
  for (int p = 0; p < m.size; ++p)
    if (all[2 * p] == color) members.emplace_back(all[2 * p + 1], p);
  std::sort(members.begin(), members.end());
  int new_rank = static_cast<int>(
      std::find(members.begin(), members.end(), std::make_pair(key, m.rank)) - members.begin());
  return create(*m.store, new_rank, static_cast<int>(members.size()), m.config,
                cat(m.name, "/split", index, "/", color));
}

Work Communicator::Impl::submit(const Fingerprint& fp, std::function<void()> fn, bool async) {
  auto op = std::make_shared<OpState>();
  op->fp = fp;
  op->run = std::move(fn);
  if (async) {
    {
      std::lock_guard lock(mu);
      if (!progress.joinable()) progress = std::thread([this] { progress_loop(); });
      queue.push_back(op);
    }
    cv.notify_all();
    return Work(op);
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return queue.empty() && !busy; });
  }
  execute(*op);
  if (op->error) std::rethrow_exception(op->error);
  return Work();
}

void Communicator::Impl::execute(OpState& op) {
  std::exception_ptr error = failed;
  if (!error) {
    try {
      op.run();
    } catch (const CommError& e) {
      transport->abort(e);
      error = std::current_exception();
    } catch (...) {
      error = std::current_exception();
    }
    if (error) failed = error;
  }
  std::lock_guard lock(op.mu);
  op.error = error;
  op.done = true;
  op.cv.notify_all();
}

void Communicator::Impl::progress_loop() {
  std::unique_lock lock(mu);
  for (;;) {
    cv.wait(lock, [&] { return stopping || !queue.empty(); });
    if (queue.empty()) return;
    auto op = queue.front();
    busy = true;
    lock.unlock();
    execute(*op);
    lock.lock();
    queue.pop_front();
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

bool Work::done() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

}  // namespace loom::comm
