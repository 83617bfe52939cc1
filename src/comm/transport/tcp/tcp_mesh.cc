#include "comm/transport/tcp/tcp_mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>

#include "comm/auth.h"
#include "comm/handshake_budget.h"
#include "comm/net.h"
#include "comm/transport/tcp/frame.h"
#include "comm/wire.h"
#include "loom/core/log.h"

namespace loom::comm {
namespace {

struct SendOp {
  FrameHeader hdr;
  const char* data;
  size_t bytes;
  size_t done = 0;  // of sizeof(hdr) + bytes
};

struct RecvOp {
  Fingerprint fp;
  char* data;
  size_t bytes;
  size_t done = 0;
  bool checked = false;  // header read and matched
};

struct Peer {
  net::Fd fd;
  std::string who;  // "rank 3"
  std::deque<SendOp> sends;
  std::deque<RecvOp> recvs;
  FrameHeader hdr{};
  size_t hdr_got = 0;
  bool data_waiting = false;  // a frame for a later op sits unread in the socket
  bool left = false;          // said goodbye
  uint64_t left_after = 0;
  bool broken = false;        // we shut it down after abort
};

}  // namespace

struct TcpMesh::Impl {
  int rank = 0, size = 0;
  int job_rank = 0;          // how messages name this rank (CommConfig::job_ranks)
  bool fingerprints = true;  // CommConfig::check_fingerprints
  Store* store = nullptr;
  std::string name;
  Deadline last_beat{};
  std::vector<Peer> peers;
  std::vector<PeerInfo> infos;

  [[noreturn]] void lost(int p, const std::string& how, const Fingerprint& cur) {
    throw PeerLostError(cat(peers[p].who, " ", how, " while this rank (rank ", job_rank, ") is in ",
                            cur.describe()),
                        p);
  }

  // A read from peer p returned r <= 0 (not EAGAIN or EINTR): says why the peer is gone.
  [[noreturn]] void read_failed(int p, ssize_t r, const Fingerprint& cur) {
    if (peers[p].left) lost(p, cat("left the communicator after ", peers[p].left_after, " ops"), cur);
    // A reset is what a process that dies with bytes unread in its socket leaves behind.
    lost(p, r == 0 ? "died or closed its connection" : cat("died or reset its connection (", std::strerror(errno), ")"),
         cur);
  }

  // Reads the rest of a control frame (abort text or goodbye) and acts on it.
  void control_frame(int p) {
    Peer& peer = peers[p];
    auto type = static_cast<FrameType>(peer.hdr.type);
    peer.hdr_got = 0;
    if (type == FrameType::kGoodbye) {
      peer.left = true;
      peer.left_after = peer.hdr.seq;
      return;
    }
    std::string text(peer.hdr.bytes, '\0');
    net::read_exact(peer.fd.get(), text.data(), text.size(), Clock::now() + std::chrono::seconds(1),
                    peer.who);
    int culprit = static_cast<int>(peer.hdr.count);
    throw_comm_error(static_cast<ErrorKind>(peer.hdr.op), cat(text, " (relayed by ", peer.who, ")"),
                     culprit);
  }

  // Reads header bytes; returns true when a whole header is in.
  bool read_header(int p, const Fingerprint& cur) {
    Peer& peer = peers[p];
    while (peer.hdr_got < sizeof(FrameHeader)) {
      ssize_t r = ::recv(peer.fd.get(), reinterpret_cast<char*>(&peer.hdr) + peer.hdr_got,
                         sizeof(FrameHeader) - peer.hdr_got, 0);
      if (r > 0) {
        peer.hdr_got += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      if (r < 0 && errno == EINTR) continue;
      read_failed(p, r, cur);
    }
    return true;
  }

  // Progress the head receive of peer p. Returns true if any byte moved.
  bool progress_recv(int p, const Fingerprint& cur) {
    Peer& peer = peers[p];
    bool moved = false;
    while (!peer.recvs.empty()) {
      RecvOp& op = peer.recvs.front();
      if (!op.checked) {
        size_t before = peer.hdr_got;
        bool whole = read_header(p, cur);
        moved |= peer.hdr_got != before;
        if (!whole) return moved;
        peer.data_waiting = false;
        if (check_frame(peer.hdr, op.fp, op.bytes, peer.who, job_rank, p, fingerprints) != FrameType::kData) {
          control_frame(p);
          if (peer.left) lost(p, cat("left the communicator after ", peer.left_after, " ops"), cur);
          continue;
        }
        op.checked = true;
      }
      while (op.done < op.bytes) {
        ssize_t r = ::recv(peer.fd.get(), op.data + op.done, op.bytes - op.done, 0);
        if (r > 0) {
          op.done += static_cast<size_t>(r);
          moved = true;
          continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return moved;
        if (r < 0 && errno == EINTR) continue;
        read_failed(p, r, cur);
      }
      peer.recvs.pop_front();
      peer.hdr_got = 0;
      moved = true;
    }
    return moved;
  }

  bool progress_send(int p, const Fingerprint& cur) {
    Peer& peer = peers[p];
    bool moved = false;
    while (!peer.sends.empty()) {
      SendOp& op = peer.sends.front();
      size_t total = sizeof(FrameHeader) + op.bytes;
      while (op.done < total) {
        iovec iov[2];
        int n = 0;
        if (op.done < sizeof(FrameHeader))
          iov[n++] = {reinterpret_cast<char*>(&op.hdr) + op.done, sizeof(FrameHeader) - op.done};
        size_t data_off = op.done > sizeof(FrameHeader) ? op.done - sizeof(FrameHeader) : 0;
        if (op.bytes > data_off) iov[n++] = {const_cast<char*>(op.data) + data_off, op.bytes - data_off};
        msghdr m{};
        m.msg_iov = iov;
        m.msg_iovlen = static_cast<size_t>(n);
        ssize_t w = ::sendmsg(peer.fd.get(), &m, MSG_NOSIGNAL);
        if (w > 0) {
          op.done += static_cast<size_t>(w);
          moved = true;
          continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return moved;
        if (w < 0 && errno == EINTR) continue;
        if (peer.left) lost(p, cat("left the communicator after ", peer.left_after, " ops"), cur);
        lost(p, cat("died or closed its connection (", std::strerror(errno), ")"), cur);
      }
      peer.sends.pop_front();
    }
    return moved;
  }

  // A peer we are not waiting on became readable: an abort, a goodbye, EOF, or data for
  // a later op (left unread).
  void inspect_idle(int p, const Fingerprint& cur) {
    Peer& peer = peers[p];
    if (peer.data_waiting || peer.broken) return;
    if (peer.hdr_got == sizeof(FrameHeader)) return;
    if (!read_header(p, cur)) return;
    if (check_header(peer.hdr, peer.who, p) == FrameType::kData) {
      peer.data_waiting = true;  // header kept; progress_recv continues from it
      return;
    }
    control_frame(p);
  }

  void poll_once(int timeout_ms, const Fingerprint& cur) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int p = 0; p < size; ++p) {
      Peer& peer = peers[p];
      if (p == rank || peer.broken) continue;
      short ev = 0;
      if (!peer.sends.empty()) ev |= POLLOUT;
      if (!peer.recvs.empty() || (!peer.data_waiting && !peer.left)) ev |= POLLIN;
      if (!ev) continue;
      fds.push_back({peer.fd.get(), ev, 0});
      who.push_back(p);
    }
    if (fds.empty()) return;
    int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) sys_check(-1, "poll", "peer links");
    for (size_t i = 0; rc > 0 && i < fds.size(); ++i) {
      int p = who[i];
      if (fds[i].revents && peers[p].recvs.empty() && peers[p].sends.empty()) inspect_idle(p, cur);
    }
  }
};

TcpMesh::TcpMesh(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpMesh::~TcpMesh() = default;
int TcpMesh::rank() const { return impl_->rank; }
int TcpMesh::size() const { return impl_->size; }
std::string TcpMesh::link_kind(int peer) const { return peer == impl_->rank ? "self" : "tcp"; }

void TcpMesh::isend(int peer, const Fingerprint& fp, const void* data, size_t bytes) {
  LOOM_CHECK(peer >= 0 && peer < impl_->size && peer != impl_->rank);
  impl_->peers[peer].sends.push_back(
      {make_header(FrameType::kData, fp, bytes), static_cast<const char*>(data), bytes});
}

void TcpMesh::irecv(int peer, const Fingerprint& fp, void* data, size_t bytes) {
  LOOM_CHECK(peer >= 0 && peer < impl_->size && peer != impl_->rank);
  impl_->peers[peer].recvs.push_back({fp, static_cast<char*>(data), bytes});
}

void TcpMesh::wait_all(milliseconds timeout, const Fingerprint& cur) {
  auto& m = *impl_;
  auto last_progress = Clock::now();
  try {
    for (;;) {
      bool pending = false, moved = false;
      for (int p = 0; p < m.size; ++p) {
        if (p == m.rank) continue;
        moved |= m.progress_send(p, cur);
        moved |= m.progress_recv(p, cur);
        pending |= !m.peers[p].sends.empty() || !m.peers[p].recvs.empty();
      }
      if (!pending) return;
      auto now = Clock::now();
      if (moved) {
        last_progress = now;
        continue;
      }
      if (on_stall) on_stall();
      if (now - last_progress >= timeout / 4) heartbeat();
      if (now - last_progress >= timeout) {
        std::vector<int> suspects;
        for (int p = 0; p < m.size; ++p)
          if (p != m.rank && (!m.peers[p].sends.empty() || !m.peers[p].recvs.empty())) suspects.push_back(p);
        // Ranks blocked behind the silent one are silent on their links too; their beats
        // tell them apart. Aborts that arrive meanwhile (from a rank that knows more) win.
        auto culprits = blame(suspects, timeout);
        check_peers(cur);
        std::string silent;
        int first = culprits.front();
        for (int p : culprits) silent += (silent.empty() ? "" : ", ") + m.peers[p].who;
        throw TimeoutError(cat(silent, " moved no data for ",
                               std::chrono::duration_cast<milliseconds>(timeout).count(),
                               " ms while this rank (rank ", m.job_rank, ") is in ", cur.describe(),
                               " (stopped, hung, or its link is down)"),
                           first);
      }
      auto left = std::chrono::duration_cast<milliseconds>(timeout - (now - last_progress)).count();
      // With a stall hook, come back soon: it may have ops to post.
      m.poll_once(static_cast<int>(std::clamp<int64_t>(left + 1, 1, on_stall ? 1 : 100)), cur);
    }
  } catch (...) {
    for (auto& p : m.peers) {
      p.sends.clear();
      p.recvs.clear();
    }
    throw;
  }
}

void TcpMesh::check_peers(const Fingerprint& cur) { impl_->poll_once(0, cur); }

void TcpMesh::heartbeat() {
  auto& m = *impl_;
  auto now = Clock::now();
  if (now - m.last_beat < milliseconds(50)) return;
  m.last_beat = now;
  try {
    m.store->add(cat(m.name, "/alive/", m.rank), 1, now + milliseconds(200));
  } catch (const Error&) {
    // The store is only a witness; losing it must not fail the op.
  }
}

std::vector<int> TcpMesh::blame(const std::vector<int>& suspects, milliseconds timeout) {
  auto& m = *impl_;
  // The store is a witness with a short memory: unreachable (its link may be the one
  // that is down), it names no one and the suspects stand.
  bool store_lost = false;
  auto beats = [&] {
    std::vector<int64_t> b(m.size, -1);
    Deadline d = Clock::now() + milliseconds(300);
    for (int p = 0; p < m.size && !store_lost; ++p) {
      if (p == m.rank) continue;
      try {
        if (auto v = m.store->try_get(cat(m.name, "/alive/", p), d)) b[p] = std::stoll(*v);
      } catch (const Error&) {
        store_lost = true;
      }
    }
    return b;
  };
  auto before = beats();
  if (store_lost) return suspects;
  // Every waiting rank beats at most every 50 ms once it has waited timeout/4.
  auto until = Clock::now() + std::min<milliseconds>(timeout / 4 + milliseconds(100), milliseconds(400));
  while (Clock::now() < until) {
    heartbeat();
    std::this_thread::sleep_for(milliseconds(10));
  }
  auto after = beats();
  if (store_lost) return suspects;
  std::vector<int> silent;
  for (int p = 0; p < m.size; ++p)
    if (p != m.rank && after[p] == before[p]) silent.push_back(p);
  if (silent.empty() || static_cast<int>(silent.size()) == m.size - 1) return suspects;
  return silent;
}

namespace {

void send_control(Peer& peer, FrameType type, const Fingerprint& fp, const std::string& text) {
  if (peer.broken || !peer.fd) return;
  // A frame may only start at a frame boundary; mid-frame, cutting the link is the
  // clearest signal left.
  bool mid_frame = !peer.sends.empty() && peer.sends.front().done > 0;
  if (!mid_frame) {
    FrameHeader h = make_header(type, fp, text.size());
    std::string frame(reinterpret_cast<char*>(&h), sizeof h);
    frame += text;
    ssize_t w = ::send(peer.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w == static_cast<ssize_t>(frame.size())) return;
  }
  ::shutdown(peer.fd.get(), SHUT_RDWR);
  peer.broken = true;
}

}  // namespace

void TcpMesh::abort(const CommError& why) {
  Fingerprint fp{.op = static_cast<ReduceOp>(error_kind_of(why)),
                 .count = static_cast<uint64_t>(why.peer() < 0 ? impl_->rank : why.peer())};
  std::string text = std::string(why.what()).substr(0, kMaxAbortText);
  for (int p = 0; p < impl_->size; ++p)
    if (p != impl_->rank) send_control(impl_->peers[p], FrameType::kAbort, fp, text);
}

void TcpMesh::goodbye(uint64_t ops) {
  for (int p = 0; p < impl_->size; ++p)
    if (p != impl_->rank) send_control(impl_->peers[p], FrameType::kGoodbye, {.seq = ops}, {});
}

// ---- connection setup ----

std::unique_ptr<TcpMesh> TcpMesh::connect(Store& store, const std::string& name, int rank,
                                          int size, const CommConfig& config,
                                          std::vector<PeerInfo>& peers_out) {
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->fingerprints = config.check_fingerprints;
  impl->size = size;
  impl->store = &store;
  impl->name = name;
  impl->peers.resize(size);
  impl->job_rank = config.job_rank(rank);
  for (int p = 0; p < size; ++p) impl->peers[p].who = cat("rank ", config.job_rank(p));
  Deadline d = Clock::now() + config.timeout;
  if (config.secret.empty() && !net::is_loopback(config.bind_address))
    throw InputError(cat("refusing to listen on non-loopback address ", config.bind_address,
                         " without a secret (set LOOM_SECRET or LOOM_SECRET_FILE)"));

  std::string size_key = name + "/size";
  // A rank that cannot join says why under "<name>/error", so the others stop waiting.
  auto fail = [&](auto error) {
    store.set(name + "/error", error.what(), d);
    throw error;
  };
  std::string agreed = store.compare_set(size_key, "", std::to_string(size), d);
  if (agreed != std::to_string(size))
    fail(CommError(cat("world size disagreement in '", name, "': rank ", rank, " was started with ",
                       size, " ranks but another rank with ", agreed), rank));

  net::Fd listener = size > 1 ? net::listen_tcp(config.bind_address, 0) : net::Fd();
  PeerInfo mine{config.bind_address == "0.0.0.0" ? "127.0.0.1" : config.bind_address,
                size > 1 ? net::local_port(listener.get()) : 1,
                config.host_id.empty() ? this_host_id() : config.host_id, ::getpid()};
  std::string key = cat(name, "/peer/", rank);
  std::string mine_s = encode_peer_info(mine);
  std::string got = store.compare_set(key, "", mine_s, d);
  if (got != mine_s) {
    PeerInfo other = parse_peer_info(got, key);
    fail(AuthError(cat("duplicate rank ", rank, " in '", name, "': already claimed by pid ",
                       other.pid, " at ", other.host, ":", other.port), rank));
  }
  std::vector<std::string> keys;
  for (int p = 0; p < size; ++p) keys.push_back(cat(name, "/peer/", p));
  try {
    for (;;) {
      try {
        store.wait(keys, std::min(d, Clock::now() + milliseconds(100)));
        break;
      } catch (const TimeoutError&) {
        if (auto why = store.try_get(name + "/error", d)) throw CommError(*why, -1);
        if (Clock::now() >= d) throw;
      }
    }
  } catch (const TimeoutError&) {
    std::string missing;
    for (int p = 0; p < size; ++p)
      if (!store.try_get(keys[p], Clock::now() + std::chrono::seconds(5)))
        missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    throw TimeoutError(cat("rank(s) ", missing, " did not join '", name, "' within ",
                           config.timeout.count(), " ms"), -1);
  }
  impl->infos.resize(size);
  for (int p = 0; p < size; ++p) impl->infos[p] = parse_peer_info(store.get(keys[p], d), keys[p]);

  auth::Hello hello{config.job_id, name, rank, size};
  for (int p = 0; p < rank; ++p) {
    const PeerInfo& info = impl->infos[p];
    std::string who = cat("rank ", p, " of '", name, "'");
    net::Fd fd = net::connect_tcp(info.host, info.port, d, who);
    auth::connect_handshake(fd.get(), config.secret, hello, d, who);
    impl->peers[p].fd = std::move(fd);
  }
  HandshakeBudget refusals;  // paces the log lines of refused connections
  for (int accepted = 0; accepted < size - 1 - rank;) {
    net::Fd fd = net::accept_until(listener.get(), d);
    if (!fd) {
      std::string missing;
      for (int p = rank + 1; p < size; ++p)
        if (!impl->peers[p].fd) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      throw TimeoutError(cat("rank(s) ", missing, " of '", name, "' did not connect to rank ", rank,
                             " within ", config.timeout.count(), " ms"), -1);
    }
    const std::string from = net::peer_address(fd.get());
    try {
      // Each handshake gets a few seconds, not the whole deadline: a connection that says
      // nothing cannot hold the listener until the job times out.
      const Deadline hd = std::min(d, Clock::now() + auth::kHandshakeTimeout);
      auto h = auth::accept_handshake(fd.get(), config.secret, hd, [&](const auth::Hello& h) {
        if (h.job_id != config.job_id)
          return cat("rank ", rank, " belongs to job '", config.job_id, "', not job '", h.job_id,
                     "' (a rank of a stale job?)");
        if (h.purpose != name) return cat("this link is for '", name, "', not '", h.purpose, "'");
        if (h.size != size)
          return cat("world size disagreement: rank ", h.rank, " says ", h.size, ", rank ", rank,
                     " says ", size);
        if (h.rank <= rank || h.rank >= size) return cat("rank ", h.rank, " should not connect to rank ", rank);
        if (impl->peers[h.rank].fd) return cat("duplicate rank ", h.rank, " in '", name, "'");
        return std::string();
      });
      impl->peers[h.rank].fd = std::move(fd);
      ++accepted;
    } catch (const auth::Unauthenticated& e) {
      // Someone without the secret: logged and dropped, never the job's business.
      if (const int64_t n = refusals.to_log(host_of(from)); n > 0)
        log_warn(cat("rank ", rank, ": refused ", from, ": ", e.what(), n > 1 ? cat(" (", n, " refusals since the last line)") : ""));
    } catch (const AuthError& e) {
      if (std::string(e.what()).find("stale job") == std::string::npos) throw;  // a rank of this job disagrees
      log_warn(cat("rank ", rank, ": refused a connection: ", e.what()));
    } catch (const CommError& e) {
      if (const int64_t n = refusals.to_log(host_of(from)); n > 0)
        log_warn(cat("rank ", rank, ": dropped ", from, ", which failed its handshake: ", e.what()));
    }
  }
  peers_out = impl->infos;
  return std::unique_ptr<TcpMesh>(new TcpMesh(std::move(impl)));
}

}  // namespace loom::comm
