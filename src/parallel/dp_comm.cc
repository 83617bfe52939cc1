#include "parallel/dp_comm.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "parallel/exact_sum.h"

namespace loom::parallel {

using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}
void from_bf16(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

// FNV-1a over 8-byte words: a fingerprint of a buffer, to compare across ranks.
uint64_t fingerprint(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A zeroed staging tensor in `t`, which the op's completion frees again.
Tensor& scratch(Tensor& t, int64_t numel, DType dt) {
  t = Tensor::zeros({numel}, dt);
  return t;
}

std::string range(const Unit& u) { return cat("[", u.begin, ", ", u.end, ")"); }

// An all-gather's output holds every rank's part padded to u.part elements (f32 or bf16):
// puts each part where it belongs in the flat `full`.
void unpack_parts(const Unit& u, int size, const Tensor& gathered, float* full) {
  for (int r = 0; r < size; ++r) {
    const int64_t at = r * u.part, len = u.mine_end(r) - u.mine_begin(r);
    if (gathered.dtype() == DType::kBF16) from_bf16(gathered.data<uint16_t>() + at, full + u.mine_begin(r), len);
    else std::copy_n(gathered.data<float>() + at, len, full + u.mine_begin(r));
  }
}

}  // namespace

int64_t resident_bytes(const void* p, size_t n) {
  if (n == 0) return 0;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p), lo = a / page * page, hi = (a + n + page - 1) / page * page;
  std::vector<unsigned char> in((hi - lo) / page);
  if (::mincore(reinterpret_cast<void*>(lo), hi - lo, in.data()) != 0) return static_cast<int64_t>(n);
  int64_t bytes = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!(in[i] & 1)) continue;
    const uintptr_t b = std::max(a, lo + i * page), e = std::min(a + n, lo + (i + 1) * page);
    bytes += static_cast<int64_t>(e - b);
  }
  return bytes;
}

void release_pages(void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p), lo = (a + page - 1) / page * page, hi = (a + n) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

void zero_pages(void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = std::min(a + n, (a + page - 1) / page * page), hi = std::max(lo, (a + n) / page * page);
  std::memset(p, 0, lo - a);
  release_pages(p, n);
  std::memset(reinterpret_cast<void*>(hi), 0, a + n - hi);
}

void UnitComm::launch_reduce(Unit& u, const Tensor& grads, const Tensor& exact, const Tensor& shard_grads) {
  const int n = comm.size();
  const int64_t len = u.end - u.begin, c = u.part;
  const bool even = u.even(n);
  const bool bf16 = config.grad_dtype == DType::kBF16 && !config.deterministic;
  const float* g = grads.data<float>() + u.begin;
  if (!scatter) {
    comm::AllReduceOptions o{.count = static_cast<size_t>(len)};
    if (config.deterministic) {
      o.output = exact.data<int64_t>() + kLimbs * u.begin;
      o.count *= kLimbs;
      o.dtype = DType::kI64;
    } else if (bf16) {
      Tensor& s = scratch(u.stage, len, DType::kBF16);
      to_bf16(g, s.data<uint16_t>(), len);
      o.output = s.raw();
      o.dtype = DType::kBF16;
    } else {
      o.output = grads.data<float>() + u.begin;
    }
    u.reduce_bytes = static_cast<int64_t>(o.count * dtype_size(o.dtype));
    u.work = comm::all_reduce_async(comm, o);
  } else {
    comm::ReduceScatterOptions o{.count = static_cast<size_t>(c)};
    if (config.deterministic) {
      const int64_t* src = exact.data<int64_t>() + kLimbs * u.begin;
      if (even) {
        o.input = src;
      } else {
        Tensor& s = scratch(u.stage, kLimbs * c * n, DType::kI64);
        std::copy_n(src, kLimbs * len, s.data<int64_t>());  // the padding stays zero
        o.input = s.raw();
      }
      o.output = scratch(u.out, kLimbs * c, DType::kI64).raw();
      o.count *= kLimbs;
      o.dtype = DType::kI64;
    } else if (bf16) {
      Tensor& s = scratch(u.stage, c * n, DType::kBF16);
      to_bf16(g, s.data<uint16_t>(), len);
      o.input = s.raw();
      o.output = scratch(u.out, c, DType::kBF16).raw();
      o.dtype = DType::kBF16;
    } else {
      if (even) {
        o.input = g;
      } else {
        Tensor& s = scratch(u.stage, c * n, DType::kF32);
        std::copy_n(g, len, s.data<float>());
        o.input = s.raw();
      }
      o.output = even ? shard_grads.data<float>() + u.shard_offset : scratch(u.out, c, DType::kF32).raw();
    }
    u.reduce_bytes = static_cast<int64_t>(o.count * static_cast<size_t>(n) * dtype_size(o.dtype));
    u.work = comm::reduce_scatter_async(comm, o);
  }
  u.pending = true;
}

void UnitComm::complete_reduce(Unit& u, const Tensor& grads, const Tensor& exact, const Tensor& shard_grads) {
  if (!u.pending) return;
  u.pending = false;
  const auto t0 = Clock::now();
  u.work.wait();
  completed(u.work, cat(scatter ? "reduce-scatter" : "all-reduce", " gradients ", range(u)), u.reduce_bytes, t0);

  const int me = comm.rank();
  const int64_t len = u.end - u.begin;
  const bool bf16 = config.grad_dtype == DType::kBF16 && !config.deterministic;
  if (!scatter) {
    float* g = grads.data<float>() + u.begin;
    if (config.deterministic) exact_decode(exact.data<int64_t>() + kLimbs * u.begin, g, len);
    else if (bf16) from_bf16(u.stage.data<uint16_t>(), g, len);
  } else {
    const int64_t mine = u.mine_end(me) - u.mine_begin(me);
    float* dst = shard_grads.data<float>() + u.shard_offset;
    if (config.deterministic) exact_decode(u.out.data<int64_t>(), dst, mine);
    else if (bf16) from_bf16(u.out.data<uint16_t>(), dst, mine);
    else if (!u.even(comm.size())) std::copy_n(u.out.data<float>(), mine, dst);
  }
  u.stage = {};
  u.out = {};
}

void UnitComm::launch_gather(Unit& u, const Tensor& values, const Tensor& shard_values) {
  const int n = comm.size(), me = comm.rank();
  const int64_t c = u.part, mine = u.mine_end(me) - u.mine_begin(me);
  const float* src = shard_values.data<float>() + u.shard_offset;
  comm::AllGatherOptions o{.count = static_cast<size_t>(c)};
  if (config.param_dtype == DType::kBF16) {
    to_bf16(src, scratch(u.gather_in, c, DType::kBF16).data<uint16_t>(), mine);
    o.input = u.gather_in.raw();
    o.output = scratch(u.gather_out, c * n, DType::kBF16).raw();
    o.dtype = DType::kBF16;
  } else if (u.even(n)) {
    o.input = src;  // every part is full: they land in place
    o.output = values.data<float>() + u.begin;
  } else {
    std::copy_n(src, mine, scratch(u.gather_in, c, DType::kF32).data<float>());
    o.input = u.gather_in.raw();
    o.output = scratch(u.gather_out, c * n, DType::kF32).raw();
  }
  u.gather_bytes = static_cast<int64_t>(o.count * static_cast<size_t>(n) * dtype_size(o.dtype));
  u.gather_work = comm::all_gather_async(comm, o);
  u.gathering = true;
}

void UnitComm::complete_gather(Unit& u, const Tensor& values) {
  if (!u.gathering) return;
  u.gathering = false;
  const auto t0 = Clock::now();
  u.gather_work.wait();
  completed(u.gather_work,
            cat("all-gather parameters ", u.group > 0 ? cat("block ", u.group - 1) : std::string("rest"), " ", range(u)),
            u.gather_bytes, t0);
  if (u.gather_out.defined()) unpack_parts(u, comm.size(), u.gather_out, values.data<float>());
  u.gather_in = {};
  u.gather_out = {};
}

void UnitComm::completed(const comm::Work& w, const std::string& what, int64_t bytes, Clock::time_point t0) {
  const auto t1 = Clock::now();
  const auto [started, finished] = w.span();
  stats.exposed_ms += ms(t0, t1);
  stats.comm_ms += ms(started, finished);
  stats.bytes += bytes;
  if (observer) observer({.what = what, .bytes = bytes, .begin = started, .end = finished, .wait_begin = t0, .wait_end = t1});
}

void UnitComm::gather(Unit& u, const Tensor& full, const Tensor& src, int64_t src_offset, const char* what) {
  const int n = comm.size(), me = comm.rank();
  const int64_t c = u.part;
  float* f = full.data<float>();
  const float* mine = src.data<float>() + src_offset;
  const size_t bytes = static_cast<size_t>(c * n) * sizeof(float);
  if (u.even(n) && mine == f + u.mine_begin(me)) {
    blocking(comm::all_gather_async(comm, {.output = f + u.begin, .count = static_cast<size_t>(c), .dtype = DType::kF32}),
             cat(what, " ", range(u)), bytes);
    return;
  }
  Tensor staging = Tensor::zeros({c * n}, DType::kF32);
  float* sd = staging.data<float>();
  std::copy(mine, mine + (u.mine_end(me) - u.mine_begin(me)), sd + me * c);
  blocking(comm::all_gather_async(comm, {.output = sd, .count = static_cast<size_t>(c), .dtype = DType::kF32}),
           cat(what, " ", range(u)), bytes);
  unpack_parts(u, n, staging, f);
}

void UnitComm::blocking(comm::Work w, const std::string& what, size_t bytes) {
  const auto t0 = Clock::now();
  w.wait();
  completed(w, what, static_cast<int64_t>(bytes), t0);
}

void UnitComm::sum_i64(int64_t* data, size_t count, const char* what) {
  blocking(comm::all_reduce_async(comm, {.output = data, .count = count, .dtype = DType::kI64}), what, count * 8);
}

void UnitComm::sum_f64(double* data, size_t count, const char* what) {
  blocking(comm::all_reduce_async(comm, {.output = data, .count = count, .dtype = DType::kF64}), what, count * 8);
}

void UnitComm::all_gather_f64(const double* in, double* out, size_t count, const char* what) {
  blocking(comm::all_gather_async(comm, {.input = in, .output = out, .count = count, .dtype = DType::kF64}), what,
           count * 8 * static_cast<size_t>(comm.size()));
}

void UnitComm::verify_equal(const Tensor& t, const std::string& what) {
  const uint64_t mine = fingerprint(t.raw(), t.nbytes());
  std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
  comm::all_gather(comm, {.input = &mine, .output = all.data(), .count = 1, .dtype = DType::kI64});
  for (int r = 0; r < comm.size(); ++r)
    if (all[r] != all[0])
      throw RuntimeError(cat(what, ": rank ", r, " holds different values than rank 0 (fingerprint ", all[r],
                             " vs ", all[0], ")"));
}

}  // namespace loom::parallel
