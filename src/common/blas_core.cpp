#include "common/blas_core.h"

#include <cstdlib>
#include <cstring>

#include <unistd.h>

extern "C" char* openblas_get_corename(void);

namespace kvq {

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

void reexec_for_blas_core(char** argv) {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") || std::strcmp(openblas_get_corename(), "Prescott") != 0) return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    core = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    core = "Haswell";
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 0);
  execv("/proc/self/exe", argv);  // returns only on failure: run on with the Prescott kernels
#else
  (void)argv;
#endif
}

}  // namespace kvq
