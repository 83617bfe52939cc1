// Knowledge distillation's loss over softmax logits (docs/numerics.md, "Distillation"):
// per row, (1 - alpha) x cross-entropy(target) + alpha x temp^2 x KL(p || q), where p
// (`soft`) is the teacher's softmax at temperature temp and q = softmax(logits / temp).
// Legend: N rows, V classes. Written over a piece of the columns, [v_begin, v_begin + v) of
// each row (vocab-parallel; a whole row is the piece [0, V)), like the vocab-parallel
// cross-entropy (kernels/cross_entropy.h): the pieces add three more figures per row.
#pragma once

#include <cstdint>

namespace loom::kernels {

// With mx (N) the largest logit of each row over every piece: sums (3, N), over this piece's
// columns, sums[i] = sum of exp((logit - mx[i]) / temp), sums[N + i] = sum of p x logit,
// sums[2N + i] = sum of p log p (0 where p is 0).
// The row's KL(p || q) is (sum of the pieces' p log p) - (sum of p x logit) / temp + mx / temp
// + log(sum of the pieces' sums[i]).
template <typename T>
void distill_slice_sums(T* sums, const T* logits, const T* soft, const T* mx, int64_t n, int64_t v, T temp);

// dlogits (N, v) = dloss x [(1 - alpha) (exp(logit - mx) / sum - onehot(target))
//                           + alpha temp (exp((logit - mx) / temp) / sum_t - p)],
// with mx, sum (of exp(logit - mx)) and sum_t (of exp((logit - mx) / temp)) over every piece.
// Overwritten; may alias logits.
template <typename T>
void distill_slice_backward(T* dlogits, const T* logits, const int32_t* targets, const T* soft, const T* mx, const T* sum,
                            const T* sum_t, T dloss, T alpha, T temp, int64_t n, int64_t v, int64_t v_begin);

}  // namespace loom::kernels
