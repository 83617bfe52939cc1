// Elementwise reduction kernels for collectives. Contributions are combined in the order
// given, so a fixed order gives identical bits on every run. bf16 and f16 are widened to
// f32, combined, and rounded once per call (round to nearest even).
// Thread-safety: pure functions over caller buffers.
#pragma once

#include <cstddef>

#include "loom/comm/comm.h"

namespace loom::comm {

// acc[i] = acc[i] (op) in[i]. kAvg combines as kSum (see finish_avg).
void reduce_into(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);

// out[i] = ins[0][i] (op) ins[1][i] (op) ... in that order, accumulated in f32 for bf16 and
// f16; then divided by n for kAvg. `out` may alias any input at the same offsets. When
// `out2` is given the result is written there too (from L1, so it costs no extra read).
// stream_out: `out` is written with streaming stores, straight to memory (the same bytes).
void reduce_many(void* out, const void* const* ins, int n, size_t count, DType dtype, ReduceOp op,
                 void* out2 = nullptr, bool stream_out = false);

// buf[i] /= n: the last step of kAvg after a sum (integers truncate toward zero).
void finish_avg(void* buf, size_t count, DType dtype, int n);

// REQUIRES nothing; InputError when a dtype/op pair is not supported (u16 reductions).
void check_reducible(DType dtype, ReduceOp op);

}  // namespace loom::comm
