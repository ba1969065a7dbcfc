#include "simd/simd.h"

#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "common/error.h"

namespace kvq {

namespace {
#if defined(__x86_64__) || defined(__i386__)
// F16C (CPUID.1:ECX bit 29); clang's __builtin_cpu_supports has no "f16c".
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif
}  // namespace

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx512Vnni: return "avx512vnni";
  }
  return "?";
}

namespace {
// What the CPU reports, asked once per level by simd_level_supported (CPUID traps to the hypervisor in a VM: a few
// microseconds a call, which a kernel table fetched per layer and step would pay each time).
bool detect(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return true;
#if (defined(__x86_64__) || defined(__i386__)) && !defined(KVQ_SIMD_OFF)
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case SimdLevel::kAvx512:
      return detect(SimdLevel::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
    case SimdLevel::kAvx512Vnni:
      return detect(SimdLevel::kAvx512) && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512vbmi");
#else
    default: return false;
#endif
  }
  return false;
}
}  // namespace

bool simd_level_supported(SimdLevel level) {
  static const bool supported[4] = {detect(SimdLevel::kScalar), detect(SimdLevel::kAvx2), detect(SimdLevel::kAvx512),
                                    detect(SimdLevel::kAvx512Vnni)};
  const int i = int(level);
  return i >= 0 && i < 4 && supported[i];
}

SimdLevel best_simd_level() {
  static const SimdLevel best = simd_level_supported(SimdLevel::kAvx512Vnni) ? SimdLevel::kAvx512Vnni
                                : simd_level_supported(SimdLevel::kAvx512) ? SimdLevel::kAvx512
                                : simd_level_supported(SimdLevel::kAvx2) ? SimdLevel::kAvx2
                                                                         : SimdLevel::kScalar;
  return best;
}

std::string supported_simd_levels() {
  std::string out;
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni})
    if (simd_level_supported(l)) out += (out.empty() ? "" : ", ") + std::string(simd_level_name(l));
  return out;
}

SimdLevel parse_simd_level(std::string_view name) {
  if (name.empty() || name == "best") return best_simd_level();
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni})
    if (name == simd_level_name(l)) {
      KVQ_CHECK(simd_level_supported(l), "--simd {}: this CPU cannot run it (it runs: {})", name,
                supported_simd_levels());
      return l;
    }
  KVQ_FAIL("unknown --simd level '{}' (levels: scalar, avx2, avx512, avx512vnni, best; this CPU runs: {})", name,
           supported_simd_levels());
}

void require_simd_level(SimdLevel level) {
  KVQ_CHECK(simd_level_supported(level), "SIMD level {} is not supported by this CPU (best here: {})",
            simd_level_name(level), simd_level_name(best_simd_level()));
}

RowKernels row_kernels(RowFormat format, SimdLevel level) {
  require_simd_level(level);
#ifndef KVQ_SIMD_OFF  // a portable build (cmake -DKVQ_SIMD=OFF) compiles the scalar kernels only
  switch (level) {
    case SimdLevel::kAvx512Vnni: return row_kernels_avx512_vnni(format);
    case SimdLevel::kAvx512: return row_kernels_avx512(format);
    case SimdLevel::kAvx2: return row_kernels_avx2(format);
    case SimdLevel::kScalar: break;
  }
#endif
  return row_kernels_scalar(format);
}

SoftmaxKernels softmax_kernels(SimdLevel level) {
  require_simd_level(level);
#ifndef KVQ_SIMD_OFF
  switch (level) {
    case SimdLevel::kAvx512Vnni:
    case SimdLevel::kAvx512: return softmax_kernels_avx512();
    case SimdLevel::kAvx2: return softmax_kernels_avx2();
    case SimdLevel::kScalar: break;
  }
#endif
  return softmax_kernels_scalar();
}

RotateRowsFn rotate_rows_kernel(SimdLevel level) {
  require_simd_level(level);
#ifndef KVQ_SIMD_OFF
  switch (level) {
    case SimdLevel::kAvx512Vnni:
    case SimdLevel::kAvx512: return rotate_rows_avx512;
    case SimdLevel::kAvx2: return rotate_rows_avx2;
    case SimdLevel::kScalar: break;
  }
#endif
  return rotate_rows_scalar;
}

Bf16Gemv bf16_gemv_kernel(SimdLevel level) {
  require_simd_level(level);
#ifndef KVQ_SIMD_OFF
  switch (level) {
    case SimdLevel::kAvx512Vnni:
    case SimdLevel::kAvx512: return bf16_gemv_avx512();
    case SimdLevel::kAvx2: return bf16_gemv_avx2();
    case SimdLevel::kScalar: break;
  }
#endif
  return {};
}

void bf16_gemv_permute(const float* x, int n, int in, int block, float* xp) {
  const int half = block / 2;
  for (size_t b = 0; b < size_t(n) * in; b += size_t(block))
    for (int l = 0; l < half; ++l) xp[b + l] = x[b + 2 * l], xp[b + half + l] = x[b + 2 * l + 1];
}

float softmax_max_ref(const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float softmax_exp_sum_ref(float* x, int n, float m) {
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - m));
  return sum;
}

}  // namespace kvq
