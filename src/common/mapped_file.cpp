#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "common/error.h"

namespace kvq {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)), path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(fmt::format("cannot stat '{}': {}", path, std::strerror(err)), path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("'{}' is not a regular file", path), path);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(fmt::format("cannot mmap '{}' ({} bytes): {}", path, size_, std::strerror(err)), path);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid after the descriptor is closed
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release_pages(const void* p, size_t bytes) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  KVQ_CHECK(begin >= reinterpret_cast<uintptr_t>(data_) && end <= reinterpret_cast<uintptr_t>(data_) + size_,
            "release_pages: [{}, +{}) is outside the mapping of '{}'", p, bytes, path_);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages inside
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void MappedFile::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

std::string read_file_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)), path);
  }
  if (!S_ISREG(st.st_mode)) throw Error(fmt::format("'{}' is not a regular file", path), path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)), path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("cannot read '{}'", path), path);
  return ss.str();
}

}  // namespace kvq
