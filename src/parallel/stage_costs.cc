#include "loom/parallel/stage_costs.h"

#include <algorithm>
#include <chrono>

#include "loom/nn/gpt.h"
#include "loom/parallel/pipeline.h"
#include "loom/core/rng.h"

namespace loom::parallel {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

std::vector<PipeCosts> measure_stage_costs(const nn::GptConfig& cfg, int stages, int v, int64_t b) {
  const int64_t t = cfg.seq_len;
  Tensor tokens = Tensor::zeros({b, t}, DType::kI32), targets = Tensor::zeros({b, t}, DType::kI32);
  Rng rng(1);
  for (int64_t i = 0; i < b * t; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
  }
  Tensor act = Tensor::zeros({b, t, cfg.d_model}, DType::kF32);  // a neighbour's activation or gradient
  for (int64_t i = 0; i < act.numel(); ++i) act.data<float>()[i] = static_cast<float>(rng.normal() * 0.1);
  std::vector<PipeCosts> costs;
  for (int s = 0; s < stages; ++s) {
    nn::Gpt gpt(cfg, DType::kF32, stage_part(cfg.n_layer, stages, v, s));
    gpt.init(1);
    std::vector<nn::GptCtx> ctx(static_cast<size_t>(v));
    std::vector<double> f, bw, bi, w;
    double kept = 0;
    for (int rep = 0; rep < 4; ++rep) {
      double tf = 0, tb = 0, tbi = 0, tw = 0;
      for (bool split : {false, true})
        for (int ch = 0; ch < v; ++ch) {
          const auto [lo, hi] = chunk_blocks(cfg.n_layer, stages, v, s, ch);
          const bool first = s == 0 && ch == 0, last = s == stages - 1 && ch == v - 1;
          double t0 = now_ms();
          gpt.begin(ctx[ch], b, t);
          Tensor h = gpt.forward_stage(lo, hi, first ? gpt.embed(tokens, ctx[ch]) : act, ctx[ch]);
          if (last) gpt.head(h, targets, ctx[ch]);
          if (!split) tf += now_ms() - t0;
          if (rep == 0 && !split) kept += static_cast<double>(ctx[ch].arena.peak_bytes()) / (1 << 20);
          t0 = now_ms();
          Tensor dx = gpt.backward_stage(lo, hi, last ? gpt.backward_head(ctx[ch], 1.0, split) : act, ctx[ch], split);
          if (first) gpt.backward_embed(dx, ctx[ch]);
          (split ? tbi : tb) += now_ms() - t0;
          if (split) {
            t0 = now_ms();
            gpt.backward_weights(lo, hi, last, ctx[ch]);
            tw += now_ms() - t0;
          }
        }
      if (rep == 0) continue;  // warm-up
      f.push_back(tf), bw.push_back(tb), bi.push_back(tbi), w.push_back(tw);
    }
    costs.push_back({.forward_ms = median(f), .backward_ms = median(bw), .backward_input_ms = median(bi),
                     .backward_weight_ms = median(w), .activation_mb = kept});
  }
  return costs;
}

}  // namespace loom::parallel
