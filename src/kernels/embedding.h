// Embedding lookup. Legend: N lookups, V table rows, C channels.
#pragma once

#include <cstdint>

namespace loom::kernels {

// out (N, C) = table[ids[i]], or zeros where ids[i] < 0 (a row another vocab-parallel piece
// holds). REQUIRES: id < V (checked by callers at the data edge).
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t n, int64_t c);
// dtable (V, C) += scatter of dout (N, C) by ids, in row order (deterministic); rows with
// ids[i] < 0 are skipped.
template <typename T>
void embedding_backward(T* dtable, const int32_t* ids, const T* dout, int64_t n, int64_t c);

}  // namespace loom::kernels
