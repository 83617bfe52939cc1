// The collectives of data parallelism (docs/parallelism.md): per unit, the gradient sum
// (all-reduce or reduce-scatter, in f32, bf16 or exact limbs), the all-gather of updated
// parts (ZeRO 1-2) and the all-gather of a block's parameters before use (ZeRO 3); plus
// the small exchanges of a step (losses, norms, fingerprints). Staging buffers live only
// while their collective is in flight, so they add nothing to the state ZeRO divides.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "loom/comm/comm.h"
#include "loom/parallel/data_parallel.h"
#include "loom/core/tensor.h"

namespace loom::parallel {

// A contiguous range [begin, end) of the flat parameter buffer, split into `size` parts of
// `part` elements (the last ones shorter or empty): rank r owns part r.
struct Unit {
  int64_t begin = 0, end = 0;
  int64_t part = 0;
  int64_t shard_offset = 0;  // where this rank's part starts in its shard buffers
  int group = 0;             // ZeRO 3: 1 + the model block owning it, 0 for the rest
  int64_t mine_begin(int r) const { return std::min(end, begin + r * part); }
  int64_t mine_end(int r) const { return std::min(end, begin + (r + 1) * part); }
  bool even(int size) const { return end - begin == part * size; }

  // The sum in flight.
  comm::Work work;
  bool pending = false;
  bool launched = false;  // this step's sum has started (a pipeline's pieces may meet it again)
  bool held = false;      // overlaps the tied embedding: waits for sum_tied_gradients()
  int64_t reduce_bytes = 0, gather_bytes = 0;  // of the collectives in flight
  Tensor stage;  // padded input (bf16, or f32/limbs of an uneven unit), when needed
  Tensor out;    // reduce-scatter output, when it cannot land in place

  // ZeRO 3's parameter all-gather in flight.
  comm::Work gather_work;
  bool gathering = false;
  Tensor gather_in;   // this rank's part, padded or as bf16, when it cannot be sent in place
  Tensor gather_out;  // every rank's part, when they cannot land in place
};

// Bytes of [p, p + n) resident in memory (mincore), and giving whole pages inside it back to
// the OS (they read as zero afterwards): how ZeRO 2 drops the full gradient buffer between
// steps.
int64_t resident_bytes(const void* p, size_t n);
void release_pages(void* p, size_t n);
// Zeroes [p, p + n) by releasing its whole pages and clearing the partial ones at the ends,
// so that zeroing does not make the range resident.
void zero_pages(void* p, size_t n);

struct UnitComm {
  comm::Communicator& comm;
  const DataParallelConfig& config;
  CommStats& stats;
  const std::function<void(const CommSpan&)>& observer;
  bool scatter = false;  // ZeRO 2-3: gradients reduce-scattered into this rank's parts

  // Starts summing unit u's gradients across ranks: from `grads` (f32) or, in
  // deterministic mode, from `exact` (limbs). ZeRO 2 reduce-scatters toward shard_grads.
  void launch_reduce(Unit& u, const Tensor& grads, const Tensor& exact, const Tensor& shard_grads);
  // Waits for it and leaves the f32 sums in grads[u] (ZeRO 0-1) or this rank's part of
  // shard_grads (ZeRO 2-3).
  void complete_reduce(Unit& u, const Tensor& grads, const Tensor& exact, const Tensor& shard_grads);
  // ZeRO 3: starts all-gathering unit u of the parameters from every rank's part (this
  // rank's in shard_values at u.shard_offset), in config.param_dtype; complete_gather
  // waits for it and leaves the f32 values in values[u].
  void launch_gather(Unit& u, const Tensor& values, const Tensor& shard_values);
  void complete_gather(Unit& u, const Tensor& values);
  // All-gathers unit u of the flat f32 `full` from every rank's part, this rank's part
  // being src[src_offset, +its length) (src may be `full` itself). Blocking.
  void gather(Unit& u, const Tensor& full, const Tensor& src, int64_t src_offset, const char* what);

  void sum_i64(int64_t* data, size_t count, const char* what);
  void sum_f64(double* data, size_t count, const char* what);
  void all_gather_f64(const double* in, double* out, size_t count, const char* what);
  // RuntimeError naming the ranks when `t`'s bits differ between ranks.
  void verify_equal(const Tensor& t, const std::string& what);

  // A collective the training thread waits for at once: all of its wait is exposed.
  void blocking(comm::Work w, const std::string& what, size_t bytes);
  // Accounts for a completed async collective waited on over [t0, now): stats, observer.
  void completed(const comm::Work& w, const std::string& what, int64_t bytes, std::chrono::steady_clock::time_point t0);
};

}  // namespace loom::parallel
