// Rendezvous: the key-value store ranks use to find each other, and the bootstrap that
// reads a launcher's environment (loom launch, torchrun / Kubernetes PyTorchJob, mpirun,
// Slurm).
//
// Store semantics (as c10d's): values are bytes; `add` treats a missing key as 0 and
// stores the decimal sum; `wait` blocks until every key exists; `compare_set` writes
// `desired` only when the current value equals `expected` (a missing key equals "") and
// returns the value now stored. Every call takes a deadline and throws TimeoutError
// (naming the keys) when it passes.
//
// TcpStore: one server (hosted by the launcher or by rank 0) and any number of clients.
// Every connection passes an HMAC-SHA256 challenge-response over the per-job secret in
// both directions before any request is read; the secret never crosses the wire. A
// connection with the wrong secret or another job id is refused and changes nothing.
// The server binds loopback unless given an address, and refuses a non-loopback address
// without a secret. Frames are length-prefixed and every length is checked against a
// cap before anything is allocated.
//
// Thread-safety: HashStore, TcpStoreServer and TcpStore clients are thread-safe (a client
// serves one request at a time; the others wait, within their deadlines).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/comm.h"

namespace loom::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value, Deadline d) = 0;
  virtual std::string get(const std::string& key, Deadline d) = 0;  // waits for the key
  virtual int64_t add(const std::string& key, int64_t delta, Deadline d) = 0;
  virtual void wait(const std::vector<std::string>& keys, Deadline d) = 0;
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired, Deadline d) = 0;
  virtual bool remove(const std::string& key, Deadline d) = 0;  // true if it existed
  // Non-blocking lookup.
  virtual std::optional<std::string> try_get(const std::string& key, Deadline d) = 0;
};

namespace store_protocol {
struct Request;
struct Response;
}  // namespace store_protocol

// A Store whose seven calls are one request/response exchange each (HashStore, TcpStore).
class KeyValueStore : public Store {
 public:
  void set(const std::string& key, const std::string& value, Deadline d) override;
  std::string get(const std::string& key, Deadline d) override;
  int64_t add(const std::string& key, int64_t delta, Deadline d) override;
  void wait(const std::vector<std::string>& keys, Deadline d) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired, Deadline d) override;
  bool remove(const std::string& key, Deadline d) override;
  std::optional<std::string> try_get(const std::string& key, Deadline d) override;

 protected:
  // Applies `r`, blocking until it can complete or `d` passes (then status kTimeout).
  virtual store_protocol::Response call(const store_protocol::Request& r, Deadline d) = 0;
};

// In-memory store shared by ranks that are threads of one process (tests).
class HashStore : public KeyValueStore {
 public:
  HashStore();
  ~HashStore() override;

 protected:
  store_protocol::Response call(const store_protocol::Request& r, Deadline d) override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

struct TcpStoreConfig {
  std::string host = "127.0.0.1";  // server: address to bind; client: address to reach
  int port = 0;                    // server: 0 picks a free port
  std::string secret;              // per-job HMAC key (see generate_secret)
  std::string job_id = "default";  // a client of another job is refused
  int rank = -1;                   // client: who is asking (named in the server's errors)
};

// The server: a thread that accepts and serves clients until destroyed.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(const TcpStoreConfig& config);  // InputError on a bad address
  ~TcpStoreServer();
  int port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

class TcpStore : public KeyValueStore {
 public:
  // Connects and authenticates, retrying until `d` (the server may start later).
  TcpStore(const TcpStoreConfig& config, Deadline d);
  ~TcpStore() override;
  struct Impl;

 protected:
  store_protocol::Response call(const store_protocol::Request& r, Deadline d) override;

 private:
  std::unique_ptr<Impl> impl_;
};

// 32 random bytes from the OS, hex encoded.
std::string generate_secret();

// What a launcher told this process, read from the environment.
struct LaunchEnv {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;         // 0: no store address given (single process)
  bool store_hosted = false;   // true: the launcher serves the store (LOOM_STORE_HOSTED=1)
  std::string secret;          // LOOM_SECRET, or the contents of LOOM_SECRET_FILE (0600)
  std::string job_id = "default";
  // The job id came from the scheduler (Slurm's job number, PMIx's namespace, torchrun's run
  // id), which anyone can predict: join_world adds a tag derived from the secret.
  bool job_id_from_scheduler = false;
  std::string source;          // "loom launch", "torchrun", "mpirun", "slurm" or "none"
  // Placement the environment may state (CommConfig's field of the same name): the host
  // this rank is on (LOOM_HOST_ID; empty: detected).
  std::string host_id;
};

// `base` with a tag only holders of `secret` can compute ("<base>-<8 hex digits>"), so
// that a job id carries the launcher's randomness even where a scheduler's id is its base.
// `base` unchanged when there is no secret.
std::string tagged_job_id(const std::string& base, const std::string& secret);

// Slurm's variables (docs/launch.md, "Slurm"). The first host of a node list ("node[01-04,07],gpu5"
// -> "node01"); and the tasks on node `node` of a tasks-per-node list ("2(x3),1": 2 on
// nodes 0-2, 1 on node 3). InputError naming `var` and its value when it is not one.
std::string first_slurm_host(const std::string& var, const std::string& list);
int slurm_tasks_on_node(const std::string& var, const std::string& counts, int node);

// Reads, in order of precedence: torchrun / PyTorchJob (RANK, WORLD_SIZE, ...), OpenMPI
// (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, ...). InputError naming the variable when a
// value is malformed or out of range, or when a secret file is readable by others.
LaunchEnv launch_env_from_environment();

// The world communicator for this process: connects to (or, as rank 0 without a hosted
// store, serves) the TcpStore at master_addr:master_port and joins. `server` receives
// the store server when this process hosts it; keep it alive as long as the
// communicator.
std::unique_ptr<Communicator> join_world(const LaunchEnv& env, CommConfig config,
                                         std::unique_ptr<TcpStoreServer>& server,
                                         std::unique_ptr<Store>& store);

}  // namespace loom::comm
