// The Gloo peer of `loom bench comm` (bench/comm_vs_peers.sh): Debian's libgloo over its TCP
// transport on 127.0.0.1 (what PyTorch's gloo backend uses), f32 all_reduce (in place with
// a fresh tag per call, as ProcessGroupGloo calls it), all_gather, reduce_scatter (Gloo's
// halving-doubling algorithm, the one it has) and broadcast, timed exactly as
// bench/peers/mpi_coll.c times MPI (see there: checked first call, warm-up, calls per rep
// calibrated to ~0.1 s and at least MIN_ITERS, the median of REPS rank-averaged reps, and
// their spread). One process per rank, started by bench/peers/run_gloo.sh:
//   RANK=r SIZE=n STORE=dir gloo_coll [--dirty-inputs] LABEL REPS MIN_ITERS SIZE [SIZE ...]
// Output lines, and the OPS filter, as mpi_coll's.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

std::shared_ptr<gloo::Context> g_ctx;
int g_rank = 0, g_size = 1;
uint32_t g_tag = 1;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void sum_f32(void* c, const void* a, const void* b, size_t n) {
  for (size_t i = 0; i < n; ++i) static_cast<float*>(c)[i] = static_cast<const float*>(a)[i] + static_cast<const float*>(b)[i];
}
void sum_f64(void* c, const void* a, const void* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    static_cast<double*>(c)[i] = static_cast<const double*>(a)[i] + static_cast<const double*>(b)[i];
}
void max_f64(void* c, const void* a, const void* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    static_cast<double*>(c)[i] = std::max(static_cast<const double*>(a)[i], static_cast<const double*>(b)[i]);
}

// One double reduced over the ranks (the bookkeeping between timed loops).
double reduce_scalar(double v, void (*fn)(void*, const void*, const void*, size_t)) {
  gloo::AllreduceOptions o(g_ctx);
  o.setOutput(&v, 1);
  o.setReduceFunction(gloo::AllreduceOptions::Func(fn));
  o.setTag(g_tag++);
  gloo::allreduce(o);
  return v;
}

void barrier() {
  gloo::BarrierOptions o(g_ctx);
  o.setTag(g_tag++);
  gloo::barrier(o);
}

enum Op { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kOps };
const char* const kNames[kOps] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};

double bus_factor(int op) {
  if (op == kAllReduce) return 2.0 * (g_size - 1) / g_size;
  if (op == kBroadcast) return 1.0;
  return static_cast<double>(g_size - 1) / g_size;
}

// The call for one op on n elements a rank (all_gather's input, reduce_scatter's output) or
// n in all; reduce_scatter's algorithm is built once per size, as a caller would keep it.
std::function<void()> call_for(int op, size_t n, float* send, float* recv) {
  switch (op) {
    case kAllReduce:
      return [=] {
        gloo::AllreduceOptions o(g_ctx);
        o.setOutput(recv, n);
        o.setReduceFunction(gloo::AllreduceOptions::Func(sum_f32));
        o.setTag(g_tag++);
        gloo::allreduce(o);
      };
    case kAllGather:
      return [=] {
        gloo::AllgatherOptions o(g_ctx);
        o.setInput(send, n);
        o.setOutput(recv, n * g_size);
        o.setTag(g_tag++);
        gloo::allgather(o);
      };
    case kReduceScatter: {
      auto algo = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
          g_ctx, std::vector<float*>{recv}, static_cast<int>(n * g_size), std::vector<int>(g_size, static_cast<int>(n)));
      return [algo] { algo->run(); };
    }
    default:
      return [=] {
        gloo::BroadcastOptions o(g_ctx);
        if (g_rank == 0) o.setInput(send, n);
        o.setOutput(recv, n);
        o.setRoot(0);
        o.setTag(g_tag++);
        gloo::broadcast(o);
      };
  }
}

// --dirty-inputs (as `loom bench comm --dirty-inputs`): before each call, write one byte of
// every 64-byte line of this rank's input with its own value, so the call starts from an
// input just written by this rank's core, as in training. In-place ops' input is recv.
bool g_dirty = false;

std::function<void()> dirtying(int op, size_t n, float* send, float* recv, std::function<void()> call) {
  if (!g_dirty) return call;
  float* in = op == kAllReduce || op == kReduceScatter ? recv : send;
  const size_t bytes = (op == kReduceScatter ? n * g_size : n) * sizeof(float);
  const bool writes = op != kBroadcast || g_rank == 0;
  return [=] {
    volatile char* p = reinterpret_cast<char*>(in);
    for (size_t i = 0; writes && i < bytes; i += 64) p[i] = p[i];
    call();
  };
}

// One call with rank r contributing r + 1; true when this rank's result is right. In-place
// ops (all_reduce, reduce_scatter) take their input in recv.
bool check(int op, size_t n, float* send, float* recv, const std::function<void()>& call) {
  const size_t total = op == kAllGather || op == kReduceScatter ? n * g_size : n;
  std::fill(send, send + total, static_cast<float>(g_rank + 1));
  std::fill(recv, recv + total, op == kAllGather || op == kBroadcast ? 0.0f : static_cast<float>(g_rank + 1));
  call();
  const float sum = static_cast<float>(g_size) * static_cast<float>(g_size + 1) / 2;
  // reduce_scatter leaves this rank's block where it sits in the buffer
  const float* out = op == kReduceScatter ? recv + n * g_rank : recv;
  for (size_t i = 0; i < (op == kAllGather ? total : n); ++i) {
    const float want = op == kAllGather ? static_cast<float>(i / n + 1) : op == kBroadcast ? 1.0f : sum;
    if (out[i] != want) return false;
  }
  return true;
}

// True when OPS is unset or names `name` as one of its comma-separated entries.
bool wanted(const std::string& name) {
  const char* ops = std::getenv("OPS");
  if (ops == nullptr || *ops == '\0') return true;
  std::string list = std::string(",") + ops + ",";
  return list.find("," + name + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  const char *rank = std::getenv("RANK"), *size = std::getenv("SIZE"), *store = std::getenv("STORE");
  if (argc > 1 && std::string(argv[1]) == "--dirty-inputs") {
    g_dirty = true;
    ++argv;
    --argc;
  }
  if (argc < 5 || rank == nullptr || size == nullptr || store == nullptr) {
    std::fprintf(stderr, "usage: RANK=r SIZE=n STORE=dir gloo_coll [--dirty-inputs] LABEL REPS MIN_ITERS SIZE [SIZE ...]\n");
    return 2;
  }
  g_rank = std::atoi(rank);
  g_size = std::atoi(size);
  const std::string label = argv[1];
  const int reps = std::atoi(argv[2]), min_iters = std::atoi(argv[3]);
  if (reps < 1 || min_iters < 1) {
    std::fprintf(stderr, "gloo_coll: REPS and MIN_ITERS must be at least 1\n");
    return 2;
  }
  std::vector<size_t> sizes;
  for (int i = 4; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));

  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  attr.ai_family = AF_INET;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore file_store(store);
  auto context = std::make_shared<gloo::rendezvous::Context>(g_rank, g_size);
  context->setTimeout(std::chrono::seconds(600));
  context->connectFullMesh(file_store, device);
  g_ctx = context;

  const size_t max_elems = *std::max_element(sizes.begin(), sizes.end()) / sizeof(float) + g_size;
  std::vector<float> send(max_elems), recv(max_elems);
  if (g_rank == 0) {
    std::printf("# %s | np=%d | gloo %d.%d.%d, tcp on 127.0.0.1\n", label.c_str(), g_size, GLOO_VERSION_MAJOR,
                GLOO_VERSION_MINOR, GLOO_VERSION_PATCH);
    std::printf("# label np op bytes time_us algbw_GBps busbw_GBps iters spread_pct check\n");
  }
  for (int op = 0; op < kOps; ++op) {
    if (!wanted(kNames[op])) continue;
    for (size_t s : sizes) {
      size_t n = s / sizeof(float);
      if (op == kAllGather || op == kReduceScatter) n /= g_size;
      n = std::max<size_t>(n, 1);
      const size_t bytes = (op == kAllGather || op == kReduceScatter ? n * g_size : n) * sizeof(float);
      const std::function<void()> call = dirtying(op, n, send.data(), recv.data(), call_for(op, n, send.data(), recv.data()));
      const bool all_ok = reduce_scalar(check(op, n, send.data(), recv.data(), call) ? 0.0 : 1.0, max_f64) == 0.0;
      const int warm = bytes <= (1u << 20) ? 20 : 5;
      barrier();
      double start = now_s();
      for (int i = 0; i < warm; ++i) call();
      const double per_call = reduce_scalar((now_s() - start) / warm, max_f64);
      const int iters = std::max(min_iters, std::min(2000, static_cast<int>(0.1 / std::max(per_call, 1e-9))));
      std::vector<double> times;
      for (int r = 0; r < reps; ++r) {
        barrier();
        start = now_s();
        for (int i = 0; i < iters; ++i) call();
        times.push_back(reduce_scalar((now_s() - start) / iters, sum_f64) / g_size);
      }
      std::sort(times.begin(), times.end());
      const double t = times[times.size() / 2], algbw = static_cast<double>(bytes) / t / 1e9;
      if (g_rank == 0) {
        std::printf("%s %d %s %zu %.2f %.3f %.3f %d %.1f %s\n", label.c_str(), g_size, kNames[op], bytes, t * 1e6, algbw,
                    algbw * bus_factor(op), iters, 100.0 * (times.back() - times.front()) / t, all_ok ? "ok" : "WRONG");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
