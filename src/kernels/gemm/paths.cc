// Which micro-kernel paths this CPU runs, which one auto picks, and their names (gemm.h).
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");  // libgcc also checks the OS saves zmm state
}
bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}
// AMX-TILE and AMX-BF16 in CPUID, the tile state enabled in XCR0 (bits 17 and 18) by the
// OS, and, as Linux (5.16 and later) asks of a process before its first tile instruction,
// the permission to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
// asked once.
bool cpu_has_amx_bf16() {
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return ::syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace

bool gemm_path_supported(GemmPath path) {
  switch (path) {
    case GemmPath::kAmx:
      return cpu_has_amx_bf16();
    case GemmPath::kAvx512Bf16:
      return cpu_has_avx512_bf16();
    case GemmPath::kAvx512:
      return cpu_has_avx512();
    case GemmPath::kAvx2:
      return cpu_has_avx2();
    default:
      return true;
  }
}

GemmPath gemm_best_path() {
  static const GemmPath best = cpu_has_avx512_bf16() ? GemmPath::kAvx512Bf16
                               : cpu_has_avx512()    ? GemmPath::kAvx512
                               : cpu_has_avx2() ? GemmPath::kAvx2
                                                : GemmPath::kGeneric;
  return best;
}

// vdpbf16ps does 32 multiply-adds where an FMA does 16, but not at the same rate on every
// CPU: twice the FMA peak on Zen 4, half of it on the Sapphire Rapids Xeon measured
// (docs/perf.md). Every path gives a bf16 product the same bits, so auto runs them on
// whichever is faster here, by the two register-only peaks (20 ms each, once).
GemmPath gemm_best_half_path() {
  static const GemmPath best = [] {
    const GemmPath p = gemm_best_path();
    if (p != GemmPath::kAvx512Bf16) return p;
    const double bf16 = bf16_peak_gflops(1, 0.02), fma = fma_peak_gflops(GemmPath::kAvx512, 1, 0.02);
    return bf16 > 1.25 * fma ? GemmPath::kAvx512Bf16 : GemmPath::kAvx512;
  }();
  return best;
}

namespace {
// Each path's name, as job.gemm_path spells it.
constexpr std::pair<GemmPath, const char*> kPathNames[] = {{GemmPath::kAuto, "auto"},
                                                           {GemmPath::kAmx, "amx"},
                                                           {GemmPath::kAvx512Bf16, "avx512_bf16"},
                                                           {GemmPath::kAvx512, "avx512"},
                                                           {GemmPath::kAvx2, "avx2"},
                                                           {GemmPath::kGeneric, "generic"}};
}  // namespace

const char* gemm_path_name(GemmPath path) {
  for (const auto& [p, name] : kPathNames)
    if (p == path) return name;
  LOOM_CHECK(false);
  return "";
}

GemmPath gemm_path_named(const std::string& name) {
  for (const auto& [p, n] : kPathNames)
    if (name == n) return p;
  throw InputError(cat("gemm path \"", name, "\": expected one of auto, amx, avx512_bf16, avx512, avx2, generic"));
}

std::vector<GemmPath> gemm_supported_paths() {
  std::vector<GemmPath> paths;
  for (GemmPath p : {GemmPath::kAvx512Bf16, GemmPath::kAvx512, GemmPath::kAvx2, GemmPath::kGeneric})
    if (gemm_path_supported(p)) paths.push_back(p);
  return paths;
}

}  // namespace loom::kernels
