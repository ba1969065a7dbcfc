// A read-only memory mapping of a whole file (RAII). Checkpoint shards are read through it without copying.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvq {

class MappedFile {
 public:
  // Maps path read-only; throws kvq::Error naming the path and the OS error when it cannot.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const uint8_t* data() const { return data_; }  // first byte; nullptr for an empty file
  size_t size() const { return size_; }          // file length in bytes
  const std::string& path() const { return path_; }
  // Drops the whole pages inside [p, p + bytes) from the process's resident set (madvise MADV_DONTNEED): the page cache
  // keeps them and a later read faults them back in. For bytes read once (the GPU upload), so that host RSS stays
  // small. p must lie in the mapping.
  void release_pages(const void* p, size_t bytes) const;

 private:
  void release();

  std::string path_;
  const uint8_t* data_ = nullptr;  // start of the mapping (size_ bytes)
  size_t size_ = 0;
};

// Reads a whole (small) file into a string; throws kvq::Error naming the path when it cannot.
std::string read_file_bytes(const std::string& path);

}  // namespace kvq
