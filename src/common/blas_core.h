// OpenBLAS's kernel choice on CPUs it does not recognise.
//
// Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH) picks its kernels from the CPU model when the library loads and, for
// models newer than its table (Sapphire Rapids and later Xeons among them), falls back to its Prescott (SSE3)
// kernels: fp32 GEMMs then run 1.6-4x slower on a CPU with AVX-512. The choice can only be changed before the
// library loads, through its documented OPENBLAS_CORETYPE variable, so the command-line entry point re-executes
// itself once with the core type this CPU supports (SkylakeX for AVX-512, Haswell for AVX2 + FMA).
#pragma once

#include <string>

namespace kvq {

// The kernels OpenBLAS runs ("SkylakeX", "Prescott", ...), as openblas_get_corename() names them.
std::string blas_core_name();

// When OpenBLAS chose Prescott on a CPU with AVX2 or AVX-512 and OPENBLAS_CORETYPE is unset: sets it and
// re-executes /proc/self/exe with argv (does not return on success). Otherwise, or if exec fails, returns.
void reexec_for_blas_core(char** argv);

}  // namespace kvq
