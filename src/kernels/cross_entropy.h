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

}  // namespace loom::kernels
