// Softmax cross-entropy over logits. Legend: N rows, V classes (vocabulary).
#pragma once

#include <cstdint>

namespace loom::kernels {

// losses (N) = logsumexp(logits[i]) - logits[i][targets[i]]. REQUIRES: 0 <= target < V.
template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t n,
                           int64_t v);
// dlogits (N, V) = (softmax(logits) - onehot(target)) * dloss (one scale for every row,
// e.g. 1/N for a mean). Overwritten; may alias logits.
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, T dloss,
                            int64_t n, int64_t v);

// Vocab-parallel cross-entropy (docs/parallelism.md, "Tensor parallelism"): each piece holds
// the columns [v_begin, v_begin + v) of every row, and the pieces combine three per-row
// figures. logits (N, v) here are a piece's columns.
// mx (N) = the largest of this piece's logits in each row.
template <typename T>
void cross_entropy_slice_max(T* mx, const T* logits, int64_t n, int64_t v);
// With mx the largest over every piece: sums (2, N), sums[i] = sum over this piece's columns
// of exp(logit - mx[i]), sums[N + i] = the target's logit when this piece holds it, else 0.
// The loss is log(sum of the pieces' sums[i]) + mx[i] - (sum of the pieces' sums[N + i]).
template <typename T>
void cross_entropy_slice_sums(T* sums, const T* logits, const int32_t* targets, const T* mx, int64_t n, int64_t v,
                              int64_t v_begin);
// dlogits (N, v) = (exp(logit - mx) / sum - onehot(target)) * dloss with mx and sum over
// every piece. Overwritten; may alias logits.
template <typename T>
void cross_entropy_slice_backward(T* dlogits, const T* logits, const int32_t* targets, const T* mx, const T* sum,
                                  T dloss, int64_t n, int64_t v, int64_t v_begin);

}  // namespace loom::kernels
