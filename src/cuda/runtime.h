// CUDA runtime helpers shared by the GPU backend: device discovery, error checks that throw kvq::Error, and an
// owning device buffer. Plain C++ header (no CUDA types), usable from host .cpp files and from .cu files.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace kvq::cuda {

// True when a CUDA device can be used (driver present, at least one device, a context can be created).
bool available();
// Why available() is false, e.g. "no CUDA device: cudaGetDeviceCount: no CUDA-capable device is detected".
std::string unavailable_reason();
// "NVIDIA H200 (sm_90, 139.8 GiB, 132 SMs)" of the current device. Requires available().
std::string device_description();
// Throws kvq::Error "--device cuda: <reason>" unless available().
void require_device();

// Throws kvq::Error "<what>: <cuda error string>" when code != cudaSuccess (code is a cudaError_t).
void check(int code, const char* what);
// Synchronises the device and checks for an asynchronous kernel error.
void sync(const char* what);

// Owning device allocation of `bytes` bytes (cudaMalloc / cudaFree); move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

  void upload(const void* host, size_t bytes, size_t offset = 0);       // host -> device
  void download(void* host, size_t bytes, size_t offset = 0) const;     // device -> host
  void zero();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvq::cuda
