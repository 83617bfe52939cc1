#include "kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/fast_math.h"
#include "kernels/fixed_sum.h"
#include "kernels/gemm/gemm.h"
#include "kernels/precision.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {
// A score block: kRows query rows by at most kCols key columns. Row block [r0, r1) attends
// to columns [0, r1) only, so nothing above the diagonal block is computed. Column blocks
// start at multiples of kCols, which row blocks never straddle: every row has a column in
// each block it visits. At T <= kCols a row block is one block, and the online softmax
// has nothing to rescale; longer sequences keep the same 32 KiB per thread. A row's columns
// past its own diagonal hold P = 0, whose products leave P V's chain as it is, so the block
// height changes no bit: 32 rows compute a fifth fewer scores than 64 (the diagonal blocks'
// masked halves), and at 12-row slivers waste no more of the kernels' rows.
constexpr int64_t kRows = 32, kCols = 256;
static_assert(kCols % kRows == 0);

// An input's value: itself, or the f32 value of `format`'s bits (exact).
template <typename T>
T value_of(DType, T x) {
  return x;
}
float value_of(DType format, uint16_t h) { return format == DType::kBF16 ? bf16_value(h) : f16_value(h); }

// One row block [r0, r1) of a (batch, head) pair: its first query row (rows ldq apart; Q
// values, or the format's bits that the keys were packed for), the head's keys as op(B) =
// K^T and values packed once for every row block, where its first output row goes (rows ldy
// apart; y_scratch: a thread's buffer, whose rows leave only as bits) and, when not null,
// its bits (rows C apart), and the head's lse.
template <typename T, typename Q = T>
struct Head {
  const Q* q;
  int64_t ldq;
  const PackedB<T>*keys, *values;
  T* y;
  int64_t ldy;
  bool y_scratch;
  uint16_t* y_bits;
  T* lse;
};

// row[j] = e^(row[j] * scale - m) for j < n, and 0 for j in [n, n rounded up to 16): their
// sum, element j in partial sum j % 16 as fixed_sum adds them. Every chunk is 16 wide, the
// last one masked (its lanes past n add +0 to a sum of exponentials, which leaves it as it
// is), so no element takes a scalar path: the tail of each causal row was up to 15 scalar
// exponentials. The chunk's exponentials and its mask are two loops: in one, GCC saw the
// mask as control flow and left the whole loop scalar on AVX2 (no mask registers), 3% of
// an fp32 gpt-mini step on Zen 3 at 2.1 ns an exponential.
template <typename T>
T exp_row(T* row, int64_t n, T scale, T m) {
  T acc[kSumLanes] = {};
  for (int64_t j = 0; j < n; j += kSumLanes) {
    T e[kSumLanes];
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) e[l] = fast_exp(row[j + l] * scale - m);
    const int64_t left = n - j;
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) {
      const T v = l < left ? e[l] : T(0);
      row[j + l] = v;
      acc[l] += v;
    }
  }
  return fixed_sum_detail::fold(acc);
}

// Rows [r0, r1) of one head, by online softmax over column blocks (docs/numerics.md,
// "Attention"): each block's scores S = Q K^T / sqrt(HS), the running max m and sum l of
// each row updated, y rescaled by e^(m_old - m_new) and P V added to it; y / l at the end,
// rounded to round_out (its bits to y_bits too), and the row's log-sum-exp m + log l for
// backward. s: kRows x kCols of scratch. The products read K^T and V as the head's packs
// hold them (in attention_forward's operands).
template <typename T, typename Q>
void forward_rows(const Head<T, Q>& hd, int64_t r0, int64_t r1, int64_t c, int64_t hs, T scale, T* s,
                  DType round_out) {
  const int64_t rows = r1 - r0;
  T m[kRows], l[kRows];
  for (int64_t c0 = 0; c0 < r1; c0 += kCols) {
    const int64_t cols = std::min(r1, c0 + kCols) - c0;
    gemm_packed_b(false, rows, cols, hs, hd.q, hd.ldq, *hd.keys, 0, c0, false, s, kCols);
    for (int64_t i = 0; i < rows; ++i) {
      T* row = s + i * kCols;
      const int64_t valid = std::min(cols, r0 + i - c0 + 1);  // causal: columns <= r0 + i
      // The largest scaled score is the largest score scaled (x -> x * scale rounds
      // monotonically, scale > 0), so the scores are scaled as they are exponentiated.
      const T mx = row_max(row, valid) * scale;
      const T m_new = c0 == 0 ? mx : std::max(m[i], mx);
      const T sum = exp_row(row, valid, scale, m_new);
      std::fill(row + std::min(cols, (valid + kSumLanes - 1) / kSumLanes * kSumLanes), row + cols, T(0));
      if (c0 == 0) {
        l[i] = sum;
      } else {
        const T alpha = fast_exp(m[i] - m_new);
        l[i] = l[i] * alpha + sum;
        if (alpha != T(1)) {
          T* yi = hd.y + i * hd.ldy;
#pragma omp simd
          for (int64_t d = 0; d < hs; ++d) yi[d] *= alpha;
        }
      }
      m[i] = m_new;
    }
    gemm_packed_b(false, rows, hs, cols, s, kCols, *hd.values, c0, 0, c0 != 0, hd.y, hd.ldy);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const T inv = T(1) / l[i];
    T* yi = hd.y + i * hd.ldy;
#pragma omp simd
    for (int64_t d = 0; d < hs; ++d) yi[d] *= inv;
    if constexpr (std::is_same_v<T, float>) {
      // Rows in a thread's buffer leave only as bits, which store_half rounds as it writes.
      if (!hd.y_scratch) round_serial(round_out, yi, yi, hs);
      if (hd.y_bits != nullptr) store_half_serial(round_out, hd.y_bits + i * c, yi, hs);
    }
    hd.lse[r0 + i] = m[i] + std::log(l[i]);
  }
}

// rows 16-bit rows of hs values, `ld` apart from src, as f32 values (exact) in out, rows hs apart.
void load_rows(DType format, const uint16_t* src, int64_t ld, int64_t rows, int64_t hs, float* out) {
  for (int64_t i = 0; i < rows; ++i) load_half_serial(format, out + i * hs, src + i * ld, hs);
}

// A task is one row block of one (batch, head) pair: row blocks are independent in forward.
// Later row blocks have more columns, so they go first, and threads take tasks as they free
// up; which thread computes a block does not change its bits. First each head's K^T and V
// are packed, once for all its row blocks (packed for each, they were a third of the
// forward's time at T = 256): pack(bh, keys, values, buffer). queries(bh, r0, r1, buffer)
// gives a row block's query rows and their stride, in `buffer` (the thread's) if it makes
// them there. Without out (out_bits only), each block's output rows are made in a buffer of
// the thread's and only their bits leave it.
template <typename T, typename Pack, typename Queries>
void forward_heads(T* out, T* lse, int64_t b, int64_t t, int64_t c, int64_t nh, DType round_out, uint16_t* out_bits,
                   const Pack& pack, const Queries& queries) {
  LOOM_CHECK((round_out == DType::kF32 || std::is_same_v<T, float>) &&
             (out_bits == nullptr || round_out != DType::kF32) && (out != nullptr || out_bits != nullptr));
  const int64_t hs = c / nh, blocks = (t + kRows - 1) / kRows;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  // Kept by the calling thread from call to call: packs allocated afresh each call faulted
  // their pages in every time (that tripled the forward's time).
  // The names bind here: inside the parallel region each thread would see its own.
  thread_local std::deque<PackedB<T>> kept_keys, kept_values;
  std::deque<PackedB<T>>&keys = kept_keys, &values = kept_values;
  while (static_cast<int64_t>(keys.size()) < b * nh) {
    keys.emplace_back();
    values.emplace_back();
  }
#pragma omp parallel
  {
    // Kept from call to call, as the backward's buffers are (fresh ones faulted their pages in).
    thread_local std::vector<T> kept_buffer, kept_rows_out;
    std::vector<T>&buffer = kept_buffer, &rows_out = kept_rows_out;
    if (out == nullptr) rows_out.resize(static_cast<size_t>(kRows * hs));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < b * nh; ++bh) pack(bh, keys[bh], values[bh], buffer);
    std::vector<T> s(kRows * kCols);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < b * nh * blocks; ++task) {
      const int64_t rb = blocks - 1 - task / (b * nh), bh = task % (b * nh), bi = bh / nh, h = bh % nh;
      const int64_t r0 = rb * kRows, r1 = std::min(t, (rb + 1) * kRows);
      const int64_t at = bi * t * c + h * hs + r0 * c;  // the block's first output row
      const auto [q, ldq] = queries(bh, r0, r1, buffer);
      using Q = std::remove_cvref_t<decltype(*q)>;  // f32 values, or 16-bit bits
      const Head<T, Q> hd{q,
                          ldq,
                          &keys[bh],
                          &values[bh],
                          out != nullptr ? out + at : rows_out.data(),
                          out != nullptr ? c : hs,
                          out == nullptr,
                          out_bits != nullptr ? out_bits + at : nullptr,
                          lse + bh * t};
      forward_rows(hd, r0, r1, c, hs, scale, s.data(), round_out);
    }
  }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh, DType operands,
                       DType round_out, uint16_t* out_bits) {
  const int64_t hs = c / nh, ld = 3 * c;
  const auto head = [=](int64_t bh) { return qkv + (bh / nh) * t * ld + (bh % nh) * hs; };
  forward_heads(
      out, lse, b, t, c, nh, round_out, out_bits,
      [&](int64_t bh, PackedB<T>& keys, PackedB<T>& values, std::vector<T>&) {
        keys.pack(operands, true, hs, t, head(bh) + c, ld);
        values.pack(operands, false, t, hs, head(bh) + 2 * c, ld);
      },
      [&](int64_t bh, int64_t r0, int64_t, std::vector<T>&) { return std::pair{head(bh) + r0 * ld, ld}; });
}

void attention_forward_bits(uint16_t* out_bits, float* lse, const uint16_t* qkv, DType format, int64_t b, int64_t t,
                            int64_t c, int64_t nh, DType operands, DType round_out) {
  LOOM_CHECK((format == DType::kBF16 || format == DType::kF16) && round_out == format);
  const int64_t hs = c / nh, ld = 3 * c;
  if (gemm_active_backend() == GemmBackend::kOpenBlas) {  // its packs read the matrices in place: whole f32 copies
    std::vector<float> values(static_cast<size_t>(b * t * ld));
    load_half(format, values.data(), qkv, b * t * ld);
    return attention_forward(static_cast<float*>(nullptr), lse, values.data(), b, t, c, nh, operands, round_out,
                             out_bits);
  }
  const auto head = [=](int64_t bh) { return qkv + (bh / nh) * t * ld + (bh % nh) * hs; };
  if (operands == format) {  // the keys and values packed, and the queries multiplied, from their bits
    return forward_heads(
        static_cast<float*>(nullptr), lse, b, t, c, nh, round_out, out_bits,
        [&](int64_t bh, PackedB<float>& keys, PackedB<float>& values, std::vector<float>&) {
          keys.pack(format, true, hs, t, head(bh) + c, ld);
          values.pack(format, false, t, hs, head(bh) + 2 * c, ld);
        },
        [&](int64_t bh, int64_t r0, int64_t, std::vector<float>&) { return std::pair{head(bh) + r0 * ld, ld}; });
  }
  // rows [r0, r1) of part (0 q, 1 k, 2 v) of a head as f32 values, rows HS apart, in buffer
  const auto load = [=](int64_t bh, int64_t part, int64_t r0, int64_t r1, std::vector<float>& buffer) {
    buffer.resize(static_cast<size_t>((r1 - r0) * hs));
    load_rows(format, head(bh) + r0 * ld + part * c, ld, r1 - r0, hs, buffer.data());
    return buffer.data();
  };
  forward_heads(
      static_cast<float*>(nullptr), lse, b, t, c, nh, round_out, out_bits,
      [&](int64_t bh, PackedB<float>& keys, PackedB<float>& values, std::vector<float>& buffer) {
        keys.pack(operands, true, hs, t, load(bh, 1, 0, t, buffer), hs);  // packed here: the buffer may go
        values.pack(operands, false, t, hs, load(bh, 2, 0, t, buffer), hs);
      },
      [&](int64_t bh, int64_t r0, int64_t r1, std::vector<float>& buffer) {
        return std::pair<const float*, int64_t>{load(bh, 0, r0, r1, buffer), hs};
      });
}

namespace {

// One head's backward inputs: its q, k and v rows `ld` apart, its forward output's y rows
// `ldy` apart; values (X = T), or 16-bit bits of the products' operands' format.
template <typename T, typename X = T>
struct HeadInputs {
  const X *q, *k, *v;
  int64_t ld;
  const X* y;
  int64_t ldy;
};

// A thread's scratch for backward_head, kept from head to head.
template <typename T>
struct BackwardScratch {
  std::vector<T> pt, dst, dsum;
  PackedB<T> q_t, dy_t, k_p, q_p, dy_p;
  explicit BackwardScratch(int64_t t) : pt(kRows * kCols), dst(kRows * kCols), dsum(static_cast<size_t>(t)) {}
};

// One (batch, head) pair. Per block of kRows keys [c0, c1) and up to kCols of the queries
// that see them (rows >= c0): P^T again from the scores and the saved log-sum-exp, then
// (docs/numerics.md, "Attention") dV_c += P^T dY_r, dP^T = V_c dY_r^T, dS^T = P^T (dP^T - D)
// / sqrt(HS) with D_i = dY_i . Y_i (= sum_j P_ij dP_ij), dQ_r += dS K_c, dK_c += dS^T Q_r.
// Keys outermost: dK and dV, two of the three sums, run over up to kCols rows per GEMM. No
// (T, T) matrix exists. The scores are computed transposed (keys by queries), so every
// product's op(B) is one of the head's Q^T, dY^T, K, Q and dY, each packed once per head:
// each product of K_c Q^T_r equals Q_r K^T_c's, product for product, so the bits are those
// of the untransposed blocks, where Q and dY were packed again for every key block. Each
// sum's first contribution overwrites, so nothing is zeroed first. dq, dk, dv: rows ld
// apart, rounded to round_out at the end while they are in cache; dy: rows C apart.
template <typename T, typename X>
void backward_head(T* dq, T* dk, T* dv, int64_t ld, const T* dy, const HeadInputs<T, X>& in, const T* lrow, int64_t t,
                   int64_t c, int64_t hs, T scale, DType operands, DType round_out, BackwardScratch<T>& s) {
  T* pt = s.pt.data();
  T* dst = s.dst.data();
  for (int64_t i = 0; i < t; ++i)
    s.dsum[i] = fixed_sum<T>(hs, [&](int64_t d) { return dy[i * c + d] * value_of(operands, in.y[i * in.ldy + d]); });
  s.q_t.pack(operands, true, hs, t, in.q, in.ld);  // op(B) = Q^T (HS, T)
  s.dy_t.pack(operands, true, hs, t, dy, c);
  s.k_p.pack(operands, false, t, hs, in.k, in.ld);  // op(B) = K (T, HS)
  s.q_p.pack(operands, false, t, hs, in.q, in.ld);
  s.dy_p.pack(operands, false, t, hs, dy, c);
  for (int64_t c0 = 0; c0 < t; c0 += kRows) {
    const int64_t cols = std::min(t, c0 + kRows) - c0;
    for (int64_t r0 = c0; r0 < t; r0 += kCols) {
      const int64_t rows = std::min(t, r0 + kCols) - r0;
      const bool first = r0 == c0;  // dK_c's and dV_c's first contribution
      // Key j (row of P^T) sees queries i >= c0 + j - r0 (causal).
      const auto seen = [&](int64_t j) { return std::clamp<int64_t>(c0 + j - r0, 0, rows); };
      gemm_packed_b(false, cols, rows, hs, in.k + c0 * in.ld, in.ld, s.q_t, 0, r0, false, pt, kCols);
      // Rows of P^T and dS^T in chunks of 16 from the one holding their first seen query
      // (the earlier queries of that chunk masked to 0), where the peeled and scalar parts of
      // each row were as long as its vector part; what is left past the last chunk alone.
      const int64_t whole = rows / kSumLanes * kSumLanes;
      const auto each_seen = [&](T* row, int64_t i0, auto&& value) {
        const int64_t a0 = std::min(whole, i0 / kSumLanes * kSumLanes);
        std::fill(row, row + a0, T(0));
#pragma omp simd
        for (int64_t i = a0; i < whole; ++i) {
          const T v = value(i);
          row[i] = i >= i0 ? v : T(0);
        }
        for (int64_t i = whole; i < rows; ++i) row[i] = i >= i0 ? value(i) : T(0);
      };
      for (int64_t j = 0; j < cols; ++j) {
        T* row = pt + j * kCols;
        const T* li = lrow + r0;
        each_seen(row, seen(j), [&](int64_t i) { return fast_exp(row[i] * scale - li[i]); });
      }
      gemm_packed_b(false, cols, hs, rows, pt, kCols, s.dy_p, r0, 0, !first, dv + c0 * ld, ld);
      gemm_packed_b(false, cols, rows, hs, in.v + c0 * in.ld, in.ld, s.dy_t, 0, r0, false, dst, kCols);
      for (int64_t j = 0; j < cols; ++j) {
        const T* prow = pt + j * kCols;
        T* row = dst + j * kCols;
        const T* di = s.dsum.data() + r0;
        each_seen(row, seen(j), [&](int64_t i) { return prow[i] * (row[i] - di[i]) * scale; });
      }
      gemm_packed_b(true, rows, hs, cols, dst, kCols, s.k_p, c0, 0, c0 != 0, dq + r0 * ld, ld);
      gemm_packed_b(false, cols, hs, rows, dst, kCols, s.q_p, r0, 0, !first, dk + c0 * ld, ld);
    }
  }
  if constexpr (std::is_same_v<T, float>)
    for (int64_t i = 0; i < t; ++i)
      for (T* g : {dq, dk, dv}) round_serial(round_out, g + i * ld, g + i * ld, hs);
}

// Every (batch, head) pair, one task each (its dQ sums over key blocks, in order); `inputs(bh,
// buffer)` gives a head's HeadInputs, in `buffer` (4 T HS values of the thread's) if it
// makes them there. With dqkv_bits, each head's sums are made in the thread's cache and
// only their bits (round_out's, as store_half writes them) leave it; dqkv is unused.
template <typename T, typename Inputs>
void backward_heads(T* dqkv, uint16_t* dqkv_bits, const T* dout, const T* lse, int64_t b, int64_t t, int64_t c,
                    int64_t nh, DType operands, DType round_out, const Inputs& inputs) {
  const int64_t hs = c / nh, ld = 3 * c;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel
  {
    // Kept from call to call, as the forward's packs are (fresh ones faulted their pages in).
    thread_local BackwardScratch<T> kept(0);
    thread_local std::vector<T> kept_buffer, kept_sums;
    BackwardScratch<T>& s = kept;
    std::vector<T>& buffer = kept_buffer;
    std::vector<T>& sums = kept_sums;
    s.dsum.resize(static_cast<size_t>(t));
    if (dqkv_bits != nullptr) sums.resize(static_cast<size_t>(3 * t * hs));
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < b * nh; ++bh) {
      const int64_t bi = bh / nh, h = bh % nh;
      const T* dy = dout + bi * t * c + h * hs;
      if (dqkv_bits == nullptr) {
        T* dq = dqkv + bi * t * ld + h * hs;
        backward_head(dq, dq + c, dq + 2 * c, ld, dy, inputs(bh, buffer), lse + bh * t, t, c, hs, scale, operands,
                      round_out, s);
        continue;
      }
      if constexpr (std::is_same_v<T, float>) {  // dq, dk, dv rows 3 HS apart in `sums`
        T* dq = sums.data();  // left unrounded: store_half rounds as it writes the bits
        backward_head(dq, dq + hs, dq + 2 * hs, 3 * hs, dy, inputs(bh, buffer), lse + bh * t, t, c, hs, scale,
                      operands, DType::kF32, s);
        uint16_t* bits = dqkv_bits + bi * t * ld + h * hs;
        for (int64_t i = 0; i < t; ++i)
          for (int64_t part = 0; part < 3; ++part)
            store_half_serial(round_out, bits + i * ld + part * c, dq + i * 3 * hs + part * hs, hs);
      }
    }
  }
}

}  // namespace

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int64_t b, int64_t t,
                        int64_t c, int64_t nh, DType operands, DType round_out) {
  LOOM_CHECK((round_out == DType::kF32 || std::is_same_v<T, float>));
  const int64_t hs = c / nh, ld = 3 * c;
  backward_heads(dqkv, nullptr, dout, lse, b, t, c, nh, operands, round_out, [&](int64_t bh, std::vector<T>&) {
    const T* q = qkv + (bh / nh) * t * ld + (bh % nh) * hs;
    return HeadInputs<T>{q, q + c, q + 2 * c, ld, out + (bh / nh) * t * c + (bh % nh) * hs, c};
  });
}

void attention_backward_bits(float* dqkv, uint16_t* dqkv_bits, const float* dout, const uint16_t* qkv,
                             const uint16_t* out, DType format, const float* lse, int64_t b, int64_t t, int64_t c,
                             int64_t nh, DType operands, DType round_out) {
  LOOM_CHECK(format == DType::kBF16 || format == DType::kF16);
  LOOM_CHECK((dqkv == nullptr) != (dqkv_bits == nullptr) && (dqkv_bits == nullptr || round_out == format));
  const int64_t hs = c / nh, ld = 3 * c;
  if (operands == format && gemm_active_backend() == GemmBackend::kLoom) {
    // The products pack q, k and v, and dsum reads y, as they are: no f32 copy of a head.
    const auto bits = [&](int64_t bh, std::vector<float>&) {
      const uint16_t* q = qkv + (bh / nh) * t * ld + (bh % nh) * hs;
      return HeadInputs<float, uint16_t>{q, q + c, q + 2 * c, ld, out + (bh / nh) * t * c + (bh % nh) * hs, c};
    };
    return backward_heads(dqkv, dqkv_bits, dout, lse, b, t, c, nh, operands, round_out, bits);
  }
  const auto inputs = [&](int64_t bh, std::vector<float>& buffer) {
    // The head's q, k, v and y as f32 values, rows HS apart, while they stay in this core's cache.
    buffer.resize(static_cast<size_t>(4 * t * hs));
    const uint16_t* q = qkv + (bh / nh) * t * ld + (bh % nh) * hs;
    const uint16_t* y = out + (bh / nh) * t * c + (bh % nh) * hs;
    for (int64_t part = 0; part < 3; ++part) load_rows(format, q + part * c, ld, t, hs, buffer.data() + part * t * hs);
    load_rows(format, y, c, t, hs, buffer.data() + 3 * t * hs);
    const float* f = buffer.data();
    return HeadInputs<float>{f, f + t * hs, f + 2 * t * hs, hs, f + 3 * t * hs, hs};
  };
  backward_heads(dqkv, dqkv_bits, dout, lse, b, t, c, nh, operands, round_out, inputs);
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, DType,
                                       DType, uint16_t*);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t, int64_t, DType,
                                        DType, uint16_t*);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t, int64_t, DType, DType);
template void attention_backward<double>(double*, const double*, const double*, const double*, const double*, int64_t,
                                         int64_t, int64_t, int64_t, DType, DType);

}  // namespace loom::kernels
