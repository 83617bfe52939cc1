// The decoding attention (kernels/attention.h): n new query rows against a sequence's paged
// key/value cache. Each new row is one task: its scores against every cached key, the
// softmax, the weighted sum of the values. A row holds every head side by side, so each
// key (value) row is read once for all heads, in order: the pages stream from memory
// instead of being revisited head by head.
//
// Every score is a fixed_sum over the head's hs products (16 lanes, each summing its
// columns in order, then folded 8, 4, 2, 1 apart), so the bits are the same on every CPU
// and in every path below. When hs is a multiple of 16 the lanes are whole vectors: 16
// scores' lanes are computed side by side and folded together, 16 in one pass of vector
// shuffles (the same additions, in the same order, as folding each alone), and the
// weighted sum of the values keeps up to 256 columns of its output in registers across
// the cached rows. Both were latency-bound before: a chain of a few FMAs and a scalar
// fold per score, and a load and store of the output per cached row. For 1, 2, 4, 8, 12, 16
// or 20 heads, a block of scores is whole rows, computed in registers with the heads' queries
// shared by the block's rows (score_blocks); the softmax's exponentials run over all the
// scores as one array, not 16 lanes per head group (4 heads filled a quarter of each vector).
//
// The cached keys and values may be kept in bf16 (S = uint16_t, an f32's high 16 bits): each
// is widened exactly as it is read, and everything else is the f32 arithmetic above.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/fast_math.h"
#include "kernels/fixed_sum.h"

namespace loom::kernels {
namespace {

static_assert(kSumLanes == 16, "the vector paths below fold 16 lanes");

// 16 lanes of T.
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct Vec16<double> {
  typedef double type __attribute__((vector_size(128)));
};
template <typename T>
using Vec = typename Vec16<T>::type;

template <typename T>
Vec<T> load(const T* p) {
  Vec<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void store(T* p, const Vec<T>& v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// Keys and values as the kernels read them: in the compute type, or kept in bf16 (uint16_t:
// an f32's high 16 bits) and widened exactly as they are read.
template <typename T>
Vec<T> widen16(const T* p) {
  return load(p);
}

inline Vec<float> widen16(const uint16_t* p) {
  typedef uint16_t Half16 __attribute__((vector_size(32)));
  typedef uint32_t Word16 __attribute__((vector_size(64)));
  Half16 h;
  __builtin_memcpy(&h, p, sizeof h);
  const Word16 w = __builtin_convertvector(h, Word16) << 16;
  Vec<float> f;
  __builtin_memcpy(&f, &w, sizeof f);
  return f;
}

template <typename T>
T widen(T x) {
  return x;
}

inline float widen(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }

// Lane numbers of a pair of vectors: 0-15 are a's lanes, 16-31 b's.
template <int... kLanes>
struct Lanes {};

// a and b's lanes numbered in Lo, plus those numbered in Hi (__builtin_shufflevector: GCC
// and Clang alike).
template <typename T, int... kLo, int... kHi>
Vec<T> pair_sum(const Vec<T>& a, const Vec<T>& b, Lanes<kLo...>, Lanes<kHi...>) {
  return __builtin_shufflevector(a, b, kLo...) + __builtin_shufflevector(a, b, kHi...);
}

// The lanes fold16's level L adds, w = 16 >> L apart: lane l of the sum is lane j + l % w of
// the pair of vectors and lane j + l % w + w (the `hi` ones), j = 2w (l / w). Level 1 adds
// lane l and l+8 of each vector (lanes 0-7 of the sum are the first's, 8-15 the second's),
// level 2 l and l+4, level 3 l and l+2, level 4 l and l+1.
template <int L, bool kHi, int... l>
constexpr Lanes<2 * (16 >> L) * (l / (16 >> L)) + l % (16 >> L) + (kHi ? 16 >> L : 0)...> fold_lanes(
    std::integer_sequence<int, l...>) {
  return {};
}

// fixed_sum's fold of 16 accumulators at once, acc(t) = make.operator()<t>() for t = 0..15
// (fold16: an array's): lane t of the result is acc(t)'s sum, added as fixed_sum_detail::fold
// adds: lane l + lane l+8, then l + l+4, l + l+2, l + l+1. Level L's vector M holds the folds
// of accumulators [M 2^L, (M+1) 2^L), made depth first: each accumulator is folded into its
// neighbours' as soon as they are made, so a few partial vectors are live, not 16
// accumulators (which, beside the queries, spilled: scores 1.2 times slower).
template <typename T, int L, int M, typename F>
__attribute__((always_inline)) inline Vec<T> fold_tree(const F& make) {
  if constexpr (L == 0) {
    return make.template operator()<M>();
  } else {
    const Vec<T> a = fold_tree<T, L - 1, 2 * M>(make);
    const Vec<T> b = fold_tree<T, L - 1, 2 * M + 1>(make);
    constexpr auto lanes = std::make_integer_sequence<int, 16>{};
    return pair_sum<T>(a, b, fold_lanes<L, false>(lanes), fold_lanes<L, true>(lanes));
  }
}

template <typename T>
__attribute__((always_inline)) inline Vec<T> fold16(const Vec<T> (&acc)[16]) {
  return fold_tree<T, 4, 0>([&]<int t>() { return acc[t]; });
}

// Scores are kept row-major: score (j, h) at s[j * nh + h], the order they are computed in.

// One score's 16 lanes before the fold: lane l sums q[d] k[d] over the head's columns d = l,
// l + 16, ... in order (kHv vectors).
template <typename T, typename S, int kHv>
inline Vec<T> head_lanes(const T* qh, const S* kh) {
  Vec<T> a = {};
#pragma GCC unroll 8
  for (int v = 0; v < kHv; ++v) a += load(qh + 16 * v) * widen16(kh + 16 * v);
  return a;
}

// A sequence's cached rows one after another across their pages (no division per row).
template <typename S>
class RowCursor {
 public:
  RowCursor(const S* const* pages, int64_t page, int64_t c) : pages_(pages), page_(page), c_(c), row_(pages[0]) {}
  const S* next() {
    if (in_page_ == page_) in_page_ = 0, row_ = pages_[++pg_];  // only when a row past the page is asked for
    ++in_page_;
    const S* r = row_;
    row_ += c_;
    return r;
  }

 private:
  const S* const* pages_;
  int64_t page_, c_, pg_ = 0, in_page_ = 0;
  const S* row_;
};

// Pair t of fold kF of a block of cached rows k[0], k[1], ... for kNh heads: row (16 kF +
// t) / kNh, head (16 kF + t) % kNh, its 16 lanes before the fold (fold_tree's `make`).
template <typename T, typename S, int kHv, int kNh, int kF>
struct BlockPair {
  const T* qi;
  const S* const* k;
  template <int t>
  __attribute__((always_inline)) Vec<T> operator()() const {
    constexpr int r = (16 * kF + t) / kNh, h = (16 * kF + t) % kNh;
    return head_lanes<T, S, kHv>(qi + h * 16 * kHv, k[r] + h * 16 * kHv);
  }
};

// Folds kF, kF + 1, ... kFolds - 1 of a block's scores into s[16 kF, 16 kFolds).
template <typename T, typename S, int kHv, int kNh, int kF, int kFolds>
__attribute__((always_inline)) inline void store_folds(const T* qi, const S* const* k, T scale, T* s) {
  if constexpr (kF < kFolds) {
    store(s + 16 * kF, fold_tree<T, 4, 0>(BlockPair<T, S, kHv, kNh, kF>{qi, k}) * scale);
    store_folds<T, S, kHv, kNh, kF + 1, kFolds>(qi, k, scale, s);
  }
}

// The scores of the first whole blocks of cached rows for kNh heads: a block is the fewest
// rows whose (row, head) pairs fill whole folds of 16 (16 / kNh rows when the heads divide 16,
// 4 rows in 3 folds for 12 heads), laid out at compile time, so the compiler sees the heads'
// queries shared by the block's rows and keeps each fold's sums in registers (16 pairs
// whose places were known only at run time were staged in memory: 2.5 times slower), each
// pair folded into its neighbours as soon as it is made (fold_tree). Returns the rows done.
template <typename T, typename S, int kHv, int kNh>
int64_t score_blocks(const T* qi, RowCursor<S>& rows, int64_t len, T scale, T* s) {
  constexpr int kRows = 16 / std::gcd(kNh, 16), kFolds = kRows * kNh / 16;
  int64_t j = 0;
  for (; j + kRows <= len; j += kRows) {
    const S* k[kRows];
    for (int r = 0; r < kRows; ++r) k[r] = rows.next();
    store_folds<T, S, kHv, kNh, 0, kFolds>(qi, k, scale, s + j * kNh);
  }
  return j;
}

// The scores of cached rows [j, len), 16 (row, head) pairs at a time in row-major order,
// each pair's sum staged in acc as it comes.
template <typename T, typename S, int kHv>
void score_pairs(const T* qi, RowCursor<S>& rows, int64_t j, int64_t len, int64_t nh, T scale, T* s) {
  constexpr int64_t hs = 16 * kHv;
  Vec<T> acc[16];
  int filled = 0;
  T* out = s + j * nh;
  auto flush = [&] {
    for (int t = filled; t < 16; ++t) acc[t] = Vec<T>{};
    store(out, fold16<T>(acc) * scale);  // a last partial block writes into s's slack
    out += filled;
    filled = 0;
  };
  for (; j < len; ++j) {
    const S* kj = rows.next();
    for (int64_t h = 0; h < nh; ++h) {
      acc[filled++] = head_lanes<T, S, kHv>(qi + h * hs, kj + h * hs);
      if (filled == 16) flush();
    }
  }
  if (filled > 0) flush();
}

// The scaled scores of one query row against cached rows [0, len) into s, for heads of
// kHv vectors (hs = 16 kHv): each (row, head) pair one fixed_sum over the head's columns,
// 16 pairs' sums computed side by side and folded together. Which pairs share a block
// changes no bits: fold16 folds each sum on its own.
template <typename T, typename S, int kHv>
void scores16(const T* qi, const S* const* kpages, int64_t page, int64_t len, int64_t c, int64_t nh, T scale, T* s) {
  RowCursor<S> rows(kpages, page, c);
  int64_t j = 0;
  if constexpr (std::is_same_v<T, float>)  // f64 (checks, not decoding) pair by pair: less code
    switch (nh) {
      case 1: j = score_blocks<T, S, kHv, 1>(qi, rows, len, scale, s); break;
      case 2: j = score_blocks<T, S, kHv, 2>(qi, rows, len, scale, s); break;
      case 4: j = score_blocks<T, S, kHv, 4>(qi, rows, len, scale, s); break;
      case 8: j = score_blocks<T, S, kHv, 8>(qi, rows, len, scale, s); break;
      case 16: j = score_blocks<T, S, kHv, 16>(qi, rows, len, scale, s); break;
      case 12: j = score_blocks<T, S, kHv, 12>(qi, rows, len, scale, s); break;  // GPT-2 small
      case 20: j = score_blocks<T, S, kHv, 20>(qi, rows, len, scale, s); break;  // GPT-2 large
      default: break;
    }
  score_pairs<T, S, kHv>(qi, rows, j, len, nh, scale, s);
}

// Each head's softmax over rows [0, len) of the scores s: the exponentials into e, laid out
// as s is (e[j nh + h]), and inv_sum[h] = 1 / the head's sum of them, added in row order.
// Heads go 16 lanes at a time (lanes past the last head read whatever the next row or the
// slack holds, and are ignored); the exponentials run over the len nh scores as one array,
// so that a few heads still fill whole vectors. inv_sum: 16 per group of 16 heads, for it
// holds each group's maxima first.
template <typename T>
void softmax_by_head(const T* s, T* e, T* inv_sum, int64_t len, int64_t nh) {
  for (int64_t h0 = 0; h0 < nh; h0 += 16) {
    Vec<T> mx = load(s + h0);
    for (int64_t j = 1; j < len; ++j) {
      const Vec<T> x = load(s + j * nh + h0);
      mx = mx < x ? x : mx;  // std::max, lane by lane
    }
    store(inv_sum + h0, mx);
  }
  // Row j's store writes past its heads too, into places a later store (row j + 1's, or
  // the next group's) overwrites, or into e's slack.
  for (int64_t j = 0; j < len; ++j)
    for (int64_t h0 = 0; h0 < nh; h0 += 16) store(e + j * nh + h0, load(s + j * nh + h0) - load(inv_sum + h0));
#pragma omp simd
  for (int64_t i = 0; i < len * nh; ++i) e[i] = fast_exp(e[i]);
  for (int64_t h0 = 0; h0 < nh; h0 += 16) {
    Vec<T> sum = {};
    for (int64_t j = 0; j < len; ++j) sum += load(e + j * nh + h0);
    alignas(128) T total[16];
    store(total, sum);
    for (int64_t l = 0; l < std::min<int64_t>(16, nh - h0); ++l) inv_sum[h0 + l] = T(1) / total[l];
  }
}

// The softmax's weight of cached row j for head h.
template <typename T>
T weight(const T* e, const T* inv_sum, int64_t nh, int64_t j, int64_t h) {
  return e[j * nh + h] * inv_sum[h];
}

// y[c0, c0 + 16 kVecs) = the sum over cached rows j, in order, of w(j, h) v_j (h the
// column's head, w = weight(e, inv_sum, ...)), kept in registers across the rows. c0 is a
// multiple of 256 or of the head size 16 kHv, and kVecs of kHv.
template <typename T, typename S, int kHv, int kVecs>
void weighted_values(T* y, const S* const* vpages, int64_t page, int64_t len, int64_t c, int64_t c0, const T* e,
                     const T* inv_sum) {
  static_assert(kVecs % kHv == 0);
  constexpr int kHeads = kVecs / kHv;
  const int64_t h0 = c0 / (16 * kHv), nh = c / (16 * kHv);
  Vec<T> acc[kVecs] = {};
  for (int64_t j0 = 0, pg = 0; j0 < len; j0 += page, ++pg) {
    const int64_t end = std::min(len, j0 + page);
    for (int64_t j = j0; j < end; ++j) {
      const S* vj = vpages[pg] + (j - j0) * c + c0;
      T w[kHeads];
#pragma GCC unroll 16
      for (int h = 0; h < kHeads; ++h) w[h] = weight(e, inv_sum, nh, j, h0 + h);
#pragma GCC unroll 16
      for (int r = 0; r < kVecs; ++r) acc[r] += w[r / kHv] * widen16(vj + 16 * r);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kVecs; ++r) store(y + c0 + 16 * r, acc[r]);
}

// One query row's output into y, for heads of kHv vectors: its scores, their softmax, and
// the values' weighted sum 256 columns at a time, then a head at a time. s, e, inv_sum:
// scratch (attention_decode's Scratch).
template <typename T, typename S, int kHv>
void decode_row16(T* y, const T* qi, const S* const* kpages, const S* const* vpages, int64_t page, int64_t len,
                  int64_t c, int64_t nh, T scale, T* s, T* e, T* inv_sum) {
  scores16<T, S, kHv>(qi, kpages, page, len, c, nh, scale, s);
  softmax_by_head(s, e, inv_sum, len, nh);
  int64_t c0 = 0;
  for (; c0 + 256 <= c; c0 += 256) weighted_values<T, S, kHv, 16>(y, vpages, page, len, c, c0, e, inv_sum);
  for (; c0 < c; c0 += 16 * kHv) weighted_values<T, S, kHv, kHv>(y, vpages, page, len, c, c0, e, inv_sum);
}

// Heads whose size is not a multiple of 16: each score a fixed_sum of its own, each output
// row added to once per cached row.
template <typename T, typename S>
void decode_row(T* y, const T* qi, const S* const* kpages, const S* const* vpages, int64_t page, int64_t len,
                int64_t c, int64_t nh, T scale, T* s, T* e, T* inv_sum) {
  const int64_t hs = c / nh;
  for (int64_t j0 = 0, pg = 0; j0 < len; j0 += page, ++pg)
    for (int64_t j = j0; j < std::min(len, j0 + page); ++j) {
      const S* kj = kpages[pg] + (j - j0) * c;
      for (int64_t h = 0; h < nh; ++h) {
        const T* qh = qi + h * hs;
        const S* kh = kj + h * hs;
        s[j * nh + h] = fixed_sum<T>(hs, [&](int64_t d) { return qh[d] * widen(kh[d]); }) * scale;
      }
    }
  softmax_by_head(s, e, inv_sum, len, nh);
  std::fill(y, y + c, T(0));
  for (int64_t j0 = 0, pg = 0; j0 < len; j0 += page, ++pg)
    for (int64_t j = j0; j < std::min(len, j0 + page); ++j) {
      const S* vj = vpages[pg] + (j - j0) * c;
      for (int64_t h = 0; h < nh; ++h) {
        const T w = weight(e, inv_sum, nh, j, h);
        T* yh = y + h * hs;
        const S* vh = vj + h * hs;
#pragma omp simd
        for (int64_t d = 0; d < hs; ++d) yh[d] += w * widen(vh[d]);
      }
    }
}

// A small call (one decoding token) runs on its caller's thread: opening a parallel region
// costs more than its work, and when the caller is already in one (sequences decoded side
// by side) a nested region would be a team of one.
template <typename T, typename S>
void decode(T* out, const T* q, int64_t ldq, const S* const* kpages, const S* const* vpages, int64_t page,
            int64_t past, int64_t n, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  auto row = decode_row<T, S>;
  if (hs == 16) row = decode_row16<T, S, 1>;
  if (hs == 32) row = decode_row16<T, S, 2>;
  if (hs == 64) row = decode_row16<T, S, 4>;
  if (hs == 128) row = decode_row16<T, S, 8>;
  // Per thread: the scores and their exponentials (each with 16 elements of slack), and each
  // head's 1 / sum (16 per group of 16 heads: softmax_by_head keeps the maxima there first).
  // Kept per thread and grown as needed, not allocated (and zeroed) per call: what a buffer
  // holds past what a call writes is never read into a result (the slack's lanes are
  // ignored, see softmax_by_head).
  struct Scratch {
    std::vector<T> s, e, inv_sum;
  };
  const int64_t longest = past + n, groups = (nh + 15) / 16;
  auto scratch = [&]() -> Scratch& {
    thread_local Scratch w;
    auto at_least = [](std::vector<T>& v, int64_t size) {
      if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
    };
    at_least(w.s, nh * longest + 16);
    at_least(w.e, nh * longest + 16);
    at_least(w.inv_sum, groups * 16);
    return w;
  };
  auto task = [&](int64_t i, Scratch& w) {
    row(out + i * c, q + i * ldq, kpages, vpages, page, past + i + 1, c, nh, scale, w.s.data(), w.e.data(),
        w.inv_sum.data());
  };
  if (n == 1 || omp_in_parallel()) {
    Scratch& w = scratch();
    for (int64_t i = 0; i < n; ++i) task(i, w);
    return;
  }
#pragma omp parallel
  {
    Scratch& w = scratch();
#pragma omp for schedule(static, 1)  // rows grow longer: dealt out in turn
    for (int64_t i = 0; i < n; ++i) task(i, w);
  }
}

}  // namespace

template <typename T>
void attention_decode(T* out, const T* q, int64_t ldq, const T* const* kpages, const T* const* vpages, int64_t page,
                      int64_t past, int64_t n, int64_t c, int64_t nh) {
  decode(out, q, ldq, kpages, vpages, page, past, n, c, nh);
}

void attention_decode(float* out, const float* q, int64_t ldq, const uint16_t* const* kpages,
                      const uint16_t* const* vpages, int64_t page, int64_t past, int64_t n, int64_t c, int64_t nh) {
  decode(out, q, ldq, kpages, vpages, page, past, n, c, nh);
}

template void attention_decode<float>(float*, const float*, int64_t, const float* const*, const float* const*, int64_t,
                                      int64_t, int64_t, int64_t, int64_t);
template void attention_decode<double>(double*, const double*, int64_t, const double* const*, const double* const*,
                                       int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace loom::kernels
