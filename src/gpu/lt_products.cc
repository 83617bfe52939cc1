// Products with fused epilogues on cuBLASLt (lt_products.h).
#include "gpu/lt_products.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "gpu/cublas.h"
#include "loom/core/error.h"
#include "loom/core/log.h"

namespace loom::gpu {
namespace {

// The largest power of two up to 256 dividing p's address (cuBLASLt's kernels load by it).
int64_t alignment(const void* p) {
  if (p == nullptr) return 256;
  const auto address = reinterpret_cast<uintptr_t>(p);
  return std::min<int64_t>(256, int64_t{1} << std::countr_zero(address | 256));
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
    case Epilogue::kBiasResidual:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kBiasGelu:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kGeluGrad:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kBiasGrad:
      return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return "bias";
    case Epilogue::kBiasResidual:
      return "bias and residual";
    case Epilogue::kBiasGelu:
      return "bias and GELU";
    case Epilogue::kGeluGrad:
      return "GELU gradient";
    case Epilogue::kBiasGrad:
      return "bias gradient";
  }
  return "?";
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  check(cublas_lt().desc_set(desc, attr, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

bool f32_out(const LtProduct& p) { return p.epilogue == Epilogue::kBiasGrad; }

}  // namespace

LtProducts::LtProducts(DeviceAllocator& alloc, cudaStream_t stream)
    : stream_(stream), workspace_(alloc, kWorkspaceBytes, "cuBLASLt workspace") {
  check(cublas_lt().create(&handle_), "cublasLtCreate");
}

LtProducts::~LtProducts() {
  for (auto& [key, plan] : plans_) destroy(plan);
  if (handle_ != nullptr) cublas_lt().destroy(handle_);
}

void LtProducts::destroy(Plan& plan) const {
  const CublasLt& lt = cublas_lt();
  for (cublasLtMatrixLayout_t* l : {&plan.a, &plan.b, &plan.c, &plan.d}) {
    if (*l != nullptr) lt.layout_destroy(*l);
    *l = nullptr;
  }
  if (plan.desc != nullptr) lt.desc_destroy(plan.desc);
  plan.desc = nullptr;
}

LtProducts::Key LtProducts::key_of(const LtProduct& p) {
  int64_t aligns = 0;  // log2 of each pointer's alignment, four bits each
  for (const void* ptr : {p.a, p.b, static_cast<const void*>(p.d), p.residual, static_cast<const void*>(p.aux),
                          static_cast<const void*>(p.bias), p.bias_bf16, static_cast<const void*>(p.bias_grad)})
    aligns = aligns << 4 | std::countr_zero(static_cast<uint64_t>(alignment(ptr)));
  return {static_cast<int>(p.epilogue), p.ta, p.tb, p.m, p.n, p.k, p.lda, p.ldb, p.ldd, aligns};
}

bool LtProducts::make(Plan& plan, const LtProduct& p, bool bias_f32) const {
  const CublasLt& lt = cublas_lt();
  destroy(plan);
  plan.bias_f32 = bias_f32;
  check(lt.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, p.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, p.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(p.epilogue));
  if (p.epilogue != Epilogue::kGeluGrad)
    set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
        int32_t{bias_f32 || p.epilogue == Epilogue::kBiasGrad ? CUDA_R_32F : CUDA_R_16BF});
  if (p.aux != nullptr) set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.ldd);
  set_pointers(plan, p);  // the heuristic reads their alignment
  const cudaDataType out = f32_out(p) ? CUDA_R_32F : CUDA_R_16BF;
  check(lt.layout_create(&plan.a, CUDA_R_16BF, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.lda), "cublasLtMatrixLayoutCreate");
  check(lt.layout_create(&plan.b, CUDA_R_16BF, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.ldb), "cublasLtMatrixLayoutCreate");
  check(lt.layout_create(&plan.c, out, p.m, p.n, p.ldd), "cublasLtMatrixLayoutCreate");
  check(lt.layout_create(&plan.d, out, p.m, p.n, p.ldd), "cublasLtMatrixLayoutCreate");

  cublasLtMatmulPreference_t pref = nullptr;
  check(lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    check(lt.pref_set(pref, attr, &value, sizeof(value)), "cublasLtMatmulPreferenceSetAttribute");
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
  // Split products add their parts in a separate step over the workspace, never in place
  // on the output (as the step's determinism asks: docs/gpu.md).
  set_pref(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
           uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE});
  const void* c = p.residual != nullptr ? p.residual : p.d;
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(alignment(p.a)));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(alignment(p.b)));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(alignment(c)));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(alignment(p.d)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      lt.heuristic(handle_, plan.desc, plan.a, plan.b, plan.c, plan.d, pref, 1, &result, &found);
  lt.pref_destroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  plan.algo = result.algo;
  return true;
}

void LtProducts::set_pointers(const Plan& plan, const LtProduct& p) {
  if (p.epilogue == Epilogue::kBiasGrad)
    set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(p.bias_grad));
  else if (p.epilogue != Epilogue::kGeluGrad)
    set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, plan.bias_f32 ? static_cast<const void*>(p.bias) : p.bias_bf16);
  if (p.aux != nullptr) set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
}

bool LtProducts::launch(const Plan& plan, const LtProduct& p) const {
  set_pointers(plan, p);
  const float alpha = 1.0f;
  const float beta = p.residual != nullptr || p.epilogue == Epilogue::kBiasGrad ? 1.0f : 0.0f;
  const void* c = p.residual != nullptr ? p.residual : p.d;
  return cublas_lt().matmul(handle_, plan.desc, &alpha, p.a, plan.a, p.b, plan.b, &beta, c, plan.c, p.d, plan.d,
                            &plan.algo, workspace_.as<void>(), kWorkspaceBytes, stream_) == CUBLAS_STATUS_SUCCESS;
}

bool LtProducts::run(const LtProduct& p) {
  const Key key = key_of(p);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan plan;
    // The bias in f32 as the step's own epilogue adds it; its bf16 copy where cuBLASLt
    // takes only the output's type. A bias gradient is f32, as the product's output.
    bool ok = make(plan, p, true);
    const bool has_bias = p.bias != nullptr && p.bias_bf16 != nullptr;
    if (ok && !launch(plan, p)) ok = false;
    if (!ok && has_bias) ok = make(plan, p, false) && launch(plan, p);
    plan.declined = !ok;
    if (!ok) {
      destroy(plan);
      log_info(cat("cuBLASLt has no kernel for the ", epilogue_name(p.epilogue), " epilogue at m ", p.m, ", n ",
                   p.n, ", k ", p.k, ": its product and epilogue run apart"));
    }
    plans_.emplace(key, plan);
    return ok;
  }
  const Plan& plan = it->second;
  if (plan.declined) return false;
  if (!launch(plan, p))
    throw RuntimeError(cat("cublasLtMatmul failed on a product (m ", p.m, ", n ", p.n, ", k ", p.k,
                           ") it ran before with the ", epilogue_name(p.epilogue), " epilogue"));
  return true;
}

std::string LtProducts::summary() const {
  int64_t fused = 0, declined = 0, bf16_bias = 0;
  std::string which;
  for (const auto& [key, plan] : plans_) {
    if (plan.declined) {
      ++declined;
      which += cat(which.empty() ? "" : ", ", epilogue_name(static_cast<Epilogue>(std::get<0>(key))), " at ",
                   std::get<3>(key), "x", std::get<4>(key), "x", std::get<5>(key));
    } else {
      ++fused;
      if (!plan.bias_f32) ++bf16_bias;
    }
  }
  return cat(fused, " product shapes fused (", bf16_bias, " with a bf16 bias), ", declined, " declined",
             which.empty() ? "" : ": " + which);
}

}  // namespace loom::gpu
