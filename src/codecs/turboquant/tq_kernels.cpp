#include "codecs/turboquant/tq_kernels.h"

#include <cstddef>

#include "common/error.h"

namespace kvq::tq {

namespace {

namespace portable {
#include "codecs/turboquant/tq_kernels_impl.h"
}  // namespace portable

#if defined(__x86_64__) && !defined(__clang__) && !defined(KVQ_SIMD_OFF)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "codecs/turboquant/tq_kernels_impl.h"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
#include "codecs/turboquant/tq_kernels_impl.h"
}  // namespace avx512
#pragma GCC pop_options
#define KVQ_TQ_SIMD 1
#endif

}  // namespace

TileKernels tile_kernels(SimdLevel level) {
  require_simd_level(level);
#ifdef KVQ_TQ_SIMD
  if (level == SimdLevel::kAvx512 || level == SimdLevel::kAvx512Vnni) return {avx512::scores, avx512::accumulate};
  if (level == SimdLevel::kAvx2) return {avx2::scores, avx2::accumulate};
#endif
  return {portable::scores, portable::accumulate};
}

}  // namespace kvq::tq
