// Products with their epilogues fused, on cuBLASLt (docs/gpu.md, "The step and its
// numerics"): the bias, the residual and GELU applied to the f32 accumulators before the
// one rounding to bf16, GELU's derivative applied to an input gradient the same way, and
// a bias gradient summed as the weight gradient's product reads its operand. The step's
// own kernels read an f32 product back from memory for each of these; fused, the product
// writes its bf16 result once.
//
// cuBLASLt has no kernel for some combinations (its heuristic finds none, or its matmul
// refuses one it found); run() then returns false having run nothing, and the caller runs
// the product and its epilogue apart, as before. A plan (layouts, algorithm) is found once
// per shape and kept.
// Thread-safety: one thread uses an LtProducts.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "gpu/device.h"

namespace loom::gpu {

enum class Epilogue {
  kBias,          // d = round(op(a) op(b) + bias)
  kBiasResidual,  // d = round(op(a) op(b) + bias + residual)
  kBiasGelu,      // aux = round(op(a) op(b) + bias), d = round(gelu(op(a) op(b) + bias))
  kGeluGrad,      // d = round(op(a) op(b) * gelu'(aux))
  kBiasGrad,      // d += op(a) op(b) (f32); bias_grad = the sums of a's rows over k (f32, written)
};

// A column-major product d (m x n, ldd) = op(a) op(b), a and b bf16, with an epilogue.
struct LtProduct {
  Epilogue epilogue = Epilogue::kBias;
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;  // bf16, or f32 for kBiasGrad
  int64_t ldd = 0;
  const float* bias = nullptr;      // (m) f32: kBias, kBiasResidual, kBiasGelu
  const void* bias_bf16 = nullptr;  // its bf16 copy, where cuBLASLt takes no f32 bias
  const void* residual = nullptr;   // bf16, ldd: kBiasResidual
  void* aux = nullptr;              // bf16, ldd: kBiasGelu writes it, kGeluGrad reads it
  float* bias_grad = nullptr;       // (m) f32: kBiasGrad
};

class LtProducts {
 public:
  // A cuBLASLt handle and a workspace of kWorkspaceBytes from `alloc`, for work on `stream`.
  LtProducts(DeviceAllocator& alloc, cudaStream_t stream);
  ~LtProducts();
  LtProducts(const LtProducts&) = delete;
  LtProducts& operator=(const LtProducts&) = delete;

  // Enqueues the product with its epilogue; false, with nothing enqueued, where cuBLASLt
  // has no kernel for it (the caller runs the product and the epilogue apart).
  bool run(const LtProduct& p);
  // "N shapes fused (bias f32), M declined: ..." for `loom bench gpu`.
  std::string summary() const;

  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper

 private:
  struct Plan {
    bool declined = false;
    bool bias_f32 = true;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The shape, the epilogue and every pointer's alignment (cuBLASLt's kernels depend on it).
  using Key = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  static Key key_of(const LtProduct& p);
  // Finds an algorithm for `p` with the bias in f32 (or bf16); false where there is none.
  bool make(Plan& plan, const LtProduct& p, bool bias_f32) const;
  void destroy(Plan& plan) const;
  // The bias (or its gradient) and aux pointers of `p` into the plan's descriptor.
  static void set_pointers(const Plan& plan, const LtProduct& p);
  bool launch(const Plan& plan, const LtProduct& p) const;

  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  DeviceBuffer workspace_;
  std::map<Key, Plan> plans_;
};

}  // namespace loom::gpu
