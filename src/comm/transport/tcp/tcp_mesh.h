// The tcp transport: one authenticated TCP connection per pair of ranks, non-blocking,
// progressed by wait_all with poll(). Frames are a 40-byte header (wire::FrameHeader,
// docs/formats.md) then the payload, written straight from and read straight into the
// caller's buffers.
// Thread-safety: one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {

struct PeerInfo {  // what each rank publishes in the store
  std::string host;  // address others connect to
  int port = 0;
  std::string host_id;  // hostname + boot id: equal means same machine
  int pid = 0;
};
std::string encode_peer_info(const PeerInfo& p);
PeerInfo parse_peer_info(const std::string& s, const std::string& key);
std::string this_host_id();

class TcpMesh : public Transport {
 public:
  // Publishes this rank's listener under "<name>/peer/<rank>", then connects to every
  // lower rank and accepts every higher one. Throws AuthError / TimeoutError naming the
  // rank that is missing, refused, or a duplicate.
  static std::unique_ptr<TcpMesh> connect(Store& store, const std::string& name, int rank,
                                          int size, const CommConfig& config,
                                          std::vector<PeerInfo>& peers_out);
  ~TcpMesh() override;

  int rank() const override;
  int size() const override;
  std::string link_kind(int peer) const override;
  void isend(int peer, const Fingerprint& fp, const void* data, size_t bytes) override;
  void irecv(int peer, const Fingerprint& fp, void* data, size_t bytes) override;
  void wait_all(milliseconds timeout, const Fingerprint& current) override;
  void abort(const CommError& why) override;
  void check_peers(const Fingerprint& current) override;
  void heartbeat() override;
  std::vector<int> blame(const std::vector<int>& suspects, milliseconds timeout) override;

  void goodbye(uint64_t ops) override;

  struct Impl;

 private:
  explicit TcpMesh(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::comm
