// Incremental decoding (loom/nn/gpt.h: make_cache, decode, decode_batch, decode_grouped):
// each token costs one position's forward against the keys and values cached so far.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/int8_matmul.h"
#include "kernels/matmul.h"
#include "kernels/precision.h"
#include "loom/core/dtype_dispatch.h"
#include "loom/core/error.h"
#include "loom/nn/gpt.h"
#include "nn/mixed.h"
#include "nn/residual.h"

namespace loom::nn {
namespace k = loom::kernels;

KvCache Gpt::make_cache() const {
  auto pool = std::make_shared<KvPagePool>(config_, KvPagePool::pages_for(config_.seq_len), params_.dtype());
  return std::move(*make_cache(pool, config_.seq_len));
}

std::optional<KvCache> Gpt::make_cache(const std::shared_ptr<KvPagePool>& pool, int64_t capacity) const {
  LOOM_CHECK(!tp_.split() && part_.all_blocks && part_.embeddings && part_.head);
  LOOM_CHECK(capacity >= 1 && capacity <= config_.seq_len &&
             (pool->dtype() == params_.dtype() || (pool->dtype() == DType::kBF16 && params_.dtype() == DType::kF32)));
  std::optional<std::vector<int32_t>> pages = pool->take(KvPagePool::pages_for(capacity));
  if (!pages) return std::nullopt;
  return KvCache(pool, std::move(*pages), capacity);
}

namespace {

// Decoding: each sequence's new rows (first[s] .. first[s+1] of qkv) put their keys and
// values into its cache's pages for layer l and attend to that cache, into y. Sequences
// decoding one token each run side by side on the pool's threads: a parallel region per
// sequence (the kernel's own) would cost more than its one small attention. A prefill
// keeps the kernel's threads. Each row is computed alone either way: the same bits.

// One sequence's n rows, with its cache's keys and values kept as S: T, or bf16 (uint16_t)
// for an f32 model whose pool is kBF16, each new row rounded to nearest even as it is put.
template <typename T, typename S>
void attend_one(const KvCache& cache, const T* row, T* y, int64_t n, int64_t l, int64_t c, int64_t nh) {
  const int64_t past = cache.length, page = KvPagePool::kPositions;
  thread_local std::vector<S*> keys, values;  // reused: no allocation per sequence and layer
  cache.page_rows(l, 0, keys);
  cache.page_rows(l, 1, values);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = past + i;
    const T* key = row + i * 3 * c + c;
    const T* value = row + i * 3 * c + 2 * c;
    if constexpr (std::is_same_v<S, T>) {
      std::copy_n(key, c, keys[p / page] + (p % page) * c);
      std::copy_n(value, c, values[p / page] + (p % page) * c);
    } else {
      k::store_half(DType::kBF16, keys[p / page] + (p % page) * c, key, c);
      k::store_half(DType::kBF16, values[p / page] + (p % page) * c, value, c);
    }
  }
  k::attention_decode(y, row, 3 * c, keys.data(), values.data(), page, past, n, c, nh);
}

template <typename T>
void attend(const Tensor& qkv, const Tensor& y, std::span<KvCache* const> caches, const std::vector<int64_t>& first,
            int64_t l, int64_t c, int64_t nh) {
  const auto seqs = static_cast<int64_t>(caches.size());
  auto one = [&](int64_t s) {
    const KvCache& cache = *caches[s];
    const int64_t n = first[s + 1] - first[s];
    const T* row = qkv.data<T>() + first[s] * 3 * c;
    T* out = y.data<T>() + first[s] * c;
    if constexpr (std::is_same_v<T, float>) {
      if (cache.dtype() == DType::kBF16) return attend_one<float, uint16_t>(cache, row, out, n, l, c, nh);
    }
    attend_one<T, T>(cache, row, out, n, l, c, nh);
  };
  if (seqs > 1 && first.back() == seqs && omp_get_max_threads() > 1) {  // a team of one: no region to open
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < seqs; ++s) one(s);
  } else {
    for (int64_t s = 0; s < seqs; ++s) one(s);
  }
}

}  // namespace

Tensor Gpt::decode(std::span<const int32_t> tokens, KvCache& cache, Arena& arena) const {
  KvCache* caches[] = {&cache};
  const std::span<const int32_t> one[] = {tokens};
  return decode_batch(one, caches, arena).view({config_.vocab_size});
}

Tensor Gpt::decode_batch(std::span<const std::span<const int32_t>> tokens, std::span<KvCache* const> caches,
                         Arena& arena) const {
  const auto seqs = static_cast<int64_t>(tokens.size());
  const int64_t c = config_.d_model;
  LOOM_CHECK(seqs >= 1 && caches.size() == tokens.size());
  // The sequences' new tokens, one after another: sequence s's rows [first[s], first[s + 1]).
  std::vector<int64_t> first = {0};
  for (int64_t s = 0; s < seqs; ++s) {
    const KvCache& cache = *caches[s];
    const auto n = static_cast<int64_t>(tokens[s].size());
    LOOM_CHECK(n >= 1 && cache.length + n <= cache.capacity());
    first.push_back(first.back() + n);
  }
  const int64_t rows = first.back();
  arena.reset();
  Tensor ids = arena.alloc({rows}, DType::kI32), positions = arena.alloc({rows}, DType::kI32);
  for (int64_t s = 0; s < seqs; ++s)
    for (int64_t i = first[s]; i < first[s + 1]; ++i) {
      ids.data<int32_t>()[i] = tokens[s][static_cast<size_t>(i - first[s])];
      positions.data<int32_t>()[i] = static_cast<int32_t>(caches[s]->length + i - first[s]);
    }
  EmbeddingCtx wte_ctx, wpe_ctx;
  Tensor x = wte_.forward(ids, wte_ctx, arena);  // (rows, C)
  add_into(x, wpe_.forward(positions, wpe_ctx, arena));
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    const Block& block = blocks_[l];
    BlockCtx bc;  // what forward would keep for backward; not needed here
    Tensor qkv = block.attn.c_attn.forward(block.ln_1.forward(x, bc.ln_1, arena), bc.attn.c_attn, arena);  // (rows, 3C)
    Tensor y = arena.alloc({rows, c}, x.dtype());
    LOOM_DISPATCH_FLOAT(x.dtype(), T, attend<T>(qkv, y, caches, first, l, c, block.attn.n_head));
    add_into(x, block.attn.c_proj.forward(y, bc.attn.c_proj, arena));
    add_into(x, block.mlp.forward(block.ln_2.forward(x, bc.ln_2, arena), bc.mlp, arena));
  }
  Tensor last = arena.alloc({seqs, c}, x.dtype());  // each sequence's last row
  for (int64_t s = 0; s < seqs; ++s) {
    caches[s]->length += first[s + 1] - first[s];
    last.slice_rows(s, s + 1).copy_from(x.slice_rows(first[s + 1] - 1, first[s + 1]));
  }
  LayerNormCtx ln_f_ctx;
  Tensor h = ln_f_.forward(last, ln_f_ctx, arena);
  Tensor out = arena.alloc({seqs, config_.vocab_size}, x.dtype());
  head_product(out, h);
  return out;
}

Tensor Gpt::decode_grouped(std::span<const std::span<const int32_t>> tokens, std::span<KvCache* const> caches,
                           std::span<Arena> arenas, Arena& arena, const GroupLogits& each_group) const {
  const auto seqs = static_cast<int64_t>(tokens.size());
  // Three sequences or more a group: each group reads all the weights, and for a row or two
  // that costs more than sharing the products does (bench decode --grouped, docs/perf.md).
  const int64_t groups = std::min<int64_t>(static_cast<int64_t>(arenas.size()), seqs / 3);
  if (groups <= 1 || omp_in_parallel()) {
    Tensor out = decode_batch(tokens, caches, arena);
    if (each_group) each_group(0, out);
    return out;
  }
  LOOM_CHECK(caches.size() == tokens.size());
  int64_t rows = 0;
  for (const auto& t : tokens) rows += static_cast<int64_t>(t.size());
  // Group g is sequences [start[g], start[g + 1]): at least one each, cut where the rows
  // seen reach g / groups of all.
  std::vector<int64_t> start(static_cast<size_t>(groups + 1), seqs);
  start[0] = 0;
  int64_t s = 0, seen = 0;
  for (int64_t g = 1; g < groups; ++g) {
    do seen += static_cast<int64_t>(tokens[s++].size());
    while (s < seqs - (groups - g) && seen * groups < rows * g);
    start[g] = s;
  }
  std::vector<Tensor> logits(static_cast<size_t>(groups));
  std::vector<std::exception_ptr> failed(static_cast<size_t>(groups));
#pragma omp parallel for schedule(static, 1) num_threads(static_cast<int>(groups))
  for (int64_t g = 0; g < groups; ++g) {
    const auto first = static_cast<size_t>(start[g]), n = static_cast<size_t>(start[g + 1] - start[g]);
    try {
      logits[g] = decode_batch(tokens.subspan(first, n), caches.subspan(first, n), arenas[g]);
      if (each_group) each_group(start[g], logits[g]);
    } catch (...) {
      failed[g] = std::current_exception();  // an exception may not leave a parallel region
    }
  }
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
  arena.reset();
  Tensor out = arena.alloc({seqs, config_.vocab_size}, logits[0].dtype());
  for (int64_t g = 0; g < groups; ++g) out.slice_rows(start[g], start[g + 1]).copy_from(logits[g]);
  return out;
}

}  // namespace loom::nn
