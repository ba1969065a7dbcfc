// Prints the compute capabilities of this machine's GPUs as a CMake list ("90", "80;86"), for KVQ_CUDA_ARCHS=native
// (CMakeLists.txt); exits non-zero where there is none.
#include <cstdio>

#include <cuda_runtime.h>

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 1;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) return 1;
    std::printf("%s%d%d", i ? ";" : "", p.major, p.minor);
  }
  return 0;
}
