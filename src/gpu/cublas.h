// cuBLAS, opened on first use (dlopen) rather than linked: a loom binary linked with
// libcublas and libcublasLt (half a gigabyte) took 235 MB of resident memory and 1.1 s to
// start every process, `loom --help` included, measured; opened on demand they cost only
// the processes that multiply on a GPU. The CUDA runtime is linked statically and opens
// the driver itself on its first call.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace loom::gpu {

// The entry points Loom calls, with cuBLAS's own signatures.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  // cublasGemmEx's C signature (C++ sees overloads of it)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

// The library, opened once: the soname of the cuBLAS this was compiled against, then the
// toolkit's own copy. RuntimeError naming both and dlerror's reason when neither opens.
const Cublas& cublas();

// cuBLASLt's entry points for products with fused epilogues (lt_products.h).
struct CublasLt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

// libcublasLt, opened once as cublas() opens libcublas.
const CublasLt& cublas_lt();

}  // namespace loom::gpu
