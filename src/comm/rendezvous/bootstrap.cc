// Reads a launcher's environment and joins the world communicator.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdlib>
#include <thread>

#include "comm/auth.h"
#include "comm/net.h"
#include "loom/core/fileio.h"
#include "loom/comm/rendezvous.h"

namespace loom::comm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int lo, int hi, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  int out = 0;
  std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || p != s.data() + s.size() || out < lo || out > hi)
    throw InputError(cat("environment variable ", name, "='", v, "' is not an integer in ", lo, "..", hi));
  return out;
}

}  // namespace

std::string first_slurm_host(const std::string& var, const std::string& list) {
  auto bad = [&](const std::string& why) {
    return InputError(cat(var, "='", printable(list), "': not a Slurm node list (", why,
                          "; expected names and ranges such as node[01-04,07],gpu5)"));
  };
  std::string host;
  bool in_range = false, first_in_range = true;
  for (char c : list) {
    if (c == ',' && !in_range) break;  // the first host of the list
    if (c == '[') {
      if (in_range) throw bad("a '[' inside brackets");
      in_range = first_in_range = true;
    } else if (c == ']') {
      if (!in_range) throw bad("a ']' without its '['");
      in_range = false;
    } else if (in_range) {
      if (c == '-' || c == ',') first_in_range = false;  // the range's first number is taken
      else if (!std::isdigit(static_cast<unsigned char>(c))) throw bad("a range holds digits, '-' and ','");
      else if (first_in_range) host += c;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_') {
      host += c;
    } else {
      throw bad(cat("the character '", printable(std::string(1, c)), "'"));
    }
  }
  if (in_range) throw bad("a '[' without its ']'");
  if (host.empty()) throw bad("no host");
  return host;
}

int slurm_tasks_on_node(const std::string& var, const std::string& counts, int node) {
  auto bad = [&](const std::string& why) {
    return InputError(cat(var, "='", printable(counts), "': ", why, " (expected tasks per node such as 2(x3),1)"));
  };
  int seen = 0;
  for (size_t at = 0; at <= counts.size();) {
    size_t end = counts.find(',', at);
    if (end == std::string::npos) end = counts.size();
    const std::string item = counts.substr(at, end - at);
    at = end + 1;
    int tasks = 0, repeat = 1;
    const char* p = item.data();
    const char* const stop = item.data() + item.size();
    auto [q, ec] = std::from_chars(p, stop, tasks);
    if (ec != std::errc() || tasks < 1) throw bad(cat("'", printable(item), "' is not a task count"));
    if (q != stop) {
      auto [r, ec2] = std::string_view(q, static_cast<size_t>(stop - q)).starts_with("(x") ? std::from_chars(q + 2, stop, repeat)
                                                                                          : std::from_chars_result{q, std::errc::invalid_argument};
      if (ec2 != std::errc() || repeat < 1 || r + 1 != stop || *r != ')') throw bad(cat("'", printable(item), "' is not N or N(xM)"));
    }
    if (node < seen + repeat) return tasks;
    seen += repeat;
    if (end == counts.size()) break;
  }
  throw bad(cat("it counts ", seen, " node(s), but SLURM_NODEID is ", node));
}

namespace {

std::string read_secret_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(cat("LOOM_SECRET_FILE ", path, " cannot be read: ", std::strerror(errno)));
  if (st.st_mode & 077)
    throw InputError(cat("LOOM_SECRET_FILE ", path, " is readable by others (mode ", std::oct,
                         (st.st_mode & 0777), "); chmod 600 it"));
  std::string s = read_file(path);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw InputError(cat("LOOM_SECRET_FILE ", path, " is empty"));
  return s;
}

// World size, rank, local size and local rank from the four named variables, each
// checked against the ones before it.
void read_world(LaunchEnv& e, const char* size, const char* rank, const char* local_size,
                const char* local_rank) {
  e.size = env_int(size, 1, 1 << 20, 1);
  e.rank = env_int(rank, 0, e.size - 1, 0);
  e.local_size = env_int(local_size, 1, e.size, 1);
  e.local_rank = env_int(local_rank, 0, e.local_size - 1, 0);
}

}  // namespace

LaunchEnv launch_env_from_environment() {
  LaunchEnv e;
  if (const char* s = env("LOOM_SECRET")) e.secret = s;
  if (const char* f = env("LOOM_SECRET_FILE")) e.secret = read_secret_file(f);
  if (const char* j = env("LOOM_JOB_ID")) e.job_id = j;
  if (env("RANK") || env("WORLD_SIZE")) {
    e.source = env("LOOM_LAUNCHER") ? "loom launch" : "torchrun";
    read_world(e, "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK");
    if (const char* run = env("TORCHELASTIC_RUN_ID"); run && !env("LOOM_JOB_ID")) {
      e.job_id = run;
      e.job_id_from_scheduler = true;
    }
  } else if (env("OMPI_COMM_WORLD_SIZE")) {
    e.source = "mpirun";
    read_world(e, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
               "OMPI_COMM_WORLD_LOCAL_RANK");
    if (const char* ns = env("PMIX_NAMESPACE"); ns && !env("LOOM_JOB_ID")) {
      e.job_id = ns;
      e.job_id_from_scheduler = true;
    }
  } else if (env("SLURM_PROCID")) {
    // A job step's own variables (srun inside an allocation) first, then the job's: the
    // tasks per node in Slurm's compressed form ("2(x3),1"), this node's entry by
    // SLURM_NODEID, whatever flags the job was given (SLURM_NTASKS_PER_NODE exists only
    // with --ntasks-per-node).
    e.source = "slurm";
    const char* size_var = env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    e.size = env_int(size_var, 1, 1 << 20, 1);
    e.rank = env_int("SLURM_PROCID", 0, e.size - 1, 0);
    const char* per_node_var = env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                               : env("SLURM_TASKS_PER_NODE")    ? "SLURM_TASKS_PER_NODE"
                                                                : nullptr;
    if (per_node_var)
      e.local_size = std::min(e.size, slurm_tasks_on_node(per_node_var, env(per_node_var), env_int("SLURM_NODEID", 0, 1 << 20, 0)));
    else
      e.local_size = env_int("SLURM_NTASKS_PER_NODE", 1, e.size, 1);
    e.local_rank = env_int("SLURM_LOCALID", 0, e.local_size - 1, 0);
    const char* list_var = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    if (const char* nodes = env(list_var)) e.master_addr = first_slurm_host(list_var, nodes);
    int job = env_int("SLURM_JOB_ID", 0, 0x7fffffff, 0);
    if (!env("LOOM_JOB_ID")) {
      e.job_id = cat("slurm-", job);
      e.job_id_from_scheduler = true;
    }
    // Convention (documented in docs/launch.md): a port derived from the job id, so every
    // task computes the same one without talking.
    e.master_port = 20000 + job % 20000;
  } else {
    e.source = "none";
  }
  if (const char* a = env("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", 1, 65535, e.master_port);
  e.store_hosted = env("LOOM_STORE_HOSTED") != nullptr;
  if (const char* h = env("LOOM_HOST_ID")) e.host_id = h;
  return e;
}

std::string tagged_job_id(const std::string& base, const std::string& secret) {
  if (secret.empty()) return base;
  return cat(base, "-", auth::hex(auth::hmac_sha256(secret, "loom-job-id" + base).substr(0, 4)));
}

std::unique_ptr<Communicator> join_world(const LaunchEnv& e, CommConfig config,
                                         std::unique_ptr<TcpStoreServer>& server,
                                         std::unique_ptr<Store>& store) {
  config.secret = e.secret;
  config.job_id = e.job_id;
  if (config.host_id.empty()) config.host_id = e.host_id;
  // The id every connection of this job claims, once the secret is known.
  auto job_id = [&] { return e.job_id_from_scheduler ? tagged_job_id(e.job_id, config.secret) : e.job_id; };
  Deadline d = Clock::now() + config.timeout;
  if (e.size == 1 && e.master_port == 0) {
    store = std::make_unique<HashStore>();
    return Communicator::create(*store, 0, 1, config);
  }
  std::string host = e.master_addr;
  int port = e.master_port;
  std::string handoff;  // the 0600 files of a single-host mpirun job, removed once all joined
  if (port == 0) {
    // mpirun on one host with no MASTER_PORT: rank 0 serves on a free loopback port and
    // hands the port (and a fresh secret, if none was given) over in 0600 files.
    if (e.source != "mpirun")
      throw InputError(cat("rank ", e.rank, " of ", e.size, " has no store address: set MASTER_ADDR and MASTER_PORT"));
    std::string base = cat("/tmp/loom-", ::getuid(), "-", e.job_id);
    for (char& ch : base)
      if (ch == ':' || ch == ' ') ch = '_';
    if (e.rank == 0) {
      if (config.secret.empty()) config.secret = generate_secret();
      server = std::make_unique<TcpStoreServer>(
          TcpStoreConfig{.host = "127.0.0.1", .secret = config.secret, .job_id = job_id()});
      ::umask(077);
      write_file_atomic(base + ".secret", config.secret);
      write_file_atomic(base + ".port", std::to_string(server->port()));
    }
    while (!path_exists(base + ".port")) {
      if (Clock::now() >= d)
        throw TimeoutError(cat("rank 0 did not publish the store port in ", base, ".port"), 0);
      std::this_thread::sleep_for(milliseconds(5));
    }
    if (config.secret.empty()) config.secret = read_secret_file(base + ".secret");
    host = "127.0.0.1";
    port = std::stoi(read_file(base + ".port"));
    handoff = base;
  } else if (e.rank == 0 && !e.store_hosted) {
    server = std::make_unique<TcpStoreServer>(
        TcpStoreConfig{.host = host, .port = port, .secret = config.secret, .job_id = job_id()});
  }
  // Peers on other hosts must reach this rank: listen where the route to the store leaves
  // from, unless the caller chose an address.
  if (net::is_loopback(config.bind_address) && !net::is_loopback(host))
    config.bind_address = net::local_address_towards(host);
  config.job_id = job_id();
  store = std::make_unique<TcpStore>(
      TcpStoreConfig{.host = host, .port = port, .secret = config.secret, .job_id = config.job_id, .rank = e.rank}, d);
  auto comm = Communicator::create(*store, e.rank, e.size, config);
  // Every rank has read the files to get here (each connected to rank 0).
  if (!handoff.empty() && e.rank == 0) {
    std::remove((handoff + ".port").c_str());
    std::remove((handoff + ".secret").c_str());
  }
  return comm;
}

}  // namespace loom::comm
