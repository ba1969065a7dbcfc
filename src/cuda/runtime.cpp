#include "cuda/runtime.h"

#include <cuda_runtime.h>

#include "common/error.h"

namespace kvq::cuda {

namespace {

// Probed once per process: cudaGetDeviceCount plus a context on device 0.
struct Probe {
  bool ok = false;
  std::string reason;
  Probe() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
      return;
    }
    if (n == 0) {
      reason = "no CUDA device found";
      return;
    }
    e = cudaFree(nullptr);  // creates the primary context
    if (e != cudaSuccess) {
      reason = std::string("cannot create a CUDA context: ") + cudaGetErrorString(e);
      return;
    }
    ok = true;
  }
};

const Probe& probe() {
  static const Probe p;
  return p;
}

}  // namespace

bool available() { return probe().ok; }

std::string unavailable_reason() { return probe().ok ? std::string() : probe().reason; }

std::string device_description() {
  require_device();
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  return fmt::format("{} (sm_{}{}, {:.1f} GiB, {} SMs)", p.name, p.major, p.minor,
                     double(p.totalGlobalMem) / double(1ull << 30), p.multiProcessorCount);
}

void require_device() {
  KVQ_CHECK(available(), "--device cuda: {}", probe().reason);
}

namespace {
// The errors after which the context is corrupted and every later call fails too (CUDA runtime API: "the process must
// be terminated and relaunched").
bool sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress: case cudaErrorLaunchFailure: case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction: case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc: case cudaErrorECCUncorrectable: case cudaErrorLaunchTimeout: case cudaErrorAssert:
    case cudaErrorDevicesUnavailable: case cudaErrorNoDevice: case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}
}  // namespace

void check(int code, const char* what) {
  if (code == cudaSuccess) return;
  const cudaError_t e = cudaError_t(code);
  if (sticky(e))
    throw DeviceLost(fmt::format("the GPU is lost: {}: {}", what, cudaGetErrorString(e)), KVQ_WHERE,
                     "the CUDA context cannot be used again; restart the process");
  KVQ_FAIL("{}: {}", what, cudaGetErrorString(e));
}

void sync(const char* what) {
  check(cudaGetLastError(), what);
  check(cudaDeviceSynchronize(), what);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    KVQ_FAIL("cannot allocate {:.1f} MiB of GPU memory: {}", double(bytes) / double(1 << 20), cudaGetErrorString(e));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  KVQ_CHECK(offset + bytes <= bytes_, "DeviceBuffer::upload: {} bytes at {} past a {}-byte buffer", bytes, offset, bytes_);
  check(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  KVQ_CHECK(offset + bytes <= bytes_, "DeviceBuffer::download: {} bytes at {} past a {}-byte buffer", bytes, offset,
            bytes_);
  check(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

void DeviceBuffer::zero() {
  if (bytes_) check(cudaMemset(ptr_, 0, bytes_), "cudaMemset");
}

}  // namespace kvq::cuda
