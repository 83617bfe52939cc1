#include "loom/core/fileio.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "loom/core/error.h"
#include "loom/core/host.h"

namespace loom {

namespace {

// Opens a regular file `path` for reading; returns the descriptor and size.
std::pair<int, uint64_t> open_regular(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(cat(path, ": not a regular file"));
  }
  return {fd, static_cast<uint64_t>(st.st_size)};
}

// Opens `path` for a whole read after read_file's checks; returns the descriptor and size.
std::pair<int, size_t> open_for_read(const std::string& path, size_t max_bytes) {
  const auto [fd, size] = open_regular(path);
  if (size > max_bytes) {
    ::close(fd);
    throw InputError(cat(path, ": ", size, " bytes, over the ", max_bytes, "-byte limit of its format"));
  }
  // Whatever the format allows, a file is read whole only when memory can hold it.
  if (const double room = available_memory_bytes(); static_cast<double>(size) > room) {
    ::close(fd);
    throw InputError(cat(path, ": ", size, " bytes, more than the ", static_cast<int64_t>(room),
                         " bytes of memory available to read it into"));
  }
  return {fd, static_cast<size_t>(size)};
}

// Reads size bytes from fd into out, and closes it.
void read_all(int fd, const std::string& path, char* out, size_t size) {
  size_t got = 0;
  while (got < size) {
    ssize_t r = ::read(fd, out + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      ::close(fd);
      throw InputError(cat(path, ": read failed: ", r == 0 ? "file shrank" : std::strerror(err)));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
}

constexpr size_t kHugeBytes = size_t{1} << 21;

}  // namespace

FileHead read_file_head(const std::string& path, size_t n) {
  const auto [fd, size] = open_regular(path);
  FileHead head{.bytes = std::string(std::min<uint64_t>(n, size), '\0'), .size = size};
  read_all(fd, path, head.bytes.data(), head.bytes.size());
  return head;
}

std::string read_file(const std::string& path, size_t max_bytes) {
  const auto [fd, size] = open_for_read(path, max_bytes);
  std::string data(size, '\0');
  read_all(fd, path, data.data(), size);
  return data;
}

FileBytes::FileBytes(std::string bytes) : small_(std::move(bytes)), size_(small_.size()) {}

FileBytes::FileBytes(FileBytes&& o) noexcept
    : small_(std::move(o.small_)), map_(std::exchange(o.map_, nullptr)), size_(std::exchange(o.size_, 0)) {}

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) ::munmap(map_, size_);
    small_ = std::move(o.small_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

FileBytes::~FileBytes() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

FileBytes FileBytes::adopt(void* map, size_t size) {
  FileBytes b;
  b.map_ = map;
  b.size_ = size;
  return b;
}

FileBytes FileBytes::allocate(size_t size) {
  FileBytes b;
  b.size_ = size;
  if (size < kHugeBytes) {
    b.small_.resize(size);
    return b;
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  ::madvise(p, size, MADV_HUGEPAGE);  // advice: without huge pages it still works
  b.map_ = p;
  return b;
}

FileBytes read_file_bytes(const std::string& path, size_t max_bytes) {
  const auto [fd, size] = open_for_read(path, max_bytes);
  if (size < kHugeBytes) {
    FileBytes b = FileBytes::allocate(size);
    read_all(fd, path, b.data(), size);
    return b;
  }
  // Large files are mapped, not copied: the page cache's pages become the bytes, so reading
  // a checkpoint neither zeroes nor copies memory it then holds. Read-only (a writable
  // private mapping would copy every page as it is populated).
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw RuntimeError(cat("mmap(", path, ") failed: ", std::strerror(err)));
  ::madvise(p, size, MADV_SEQUENTIAL);
  return FileBytes::adopt(p, size);
}

void fsync_dir(const std::string& dir) {
  int fd = static_cast<int>(sys_check(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), "open", dir));
  int rc = ::fsync(fd);
  ::close(fd);
  sys_check(rc, "fsync", dir);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, std::vector<std::string_view>{bytes});
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts) {
  write_file_atomic(path, parts.size(), [&](size_t i) { return parts[i]; });
}

void write_file_atomic(const std::string& path, size_t count, const std::function<std::string_view(size_t)>& part) {
  // The rename below would replace whatever is at `path`: a FIFO, a device, a socket or a
  // link is the user's, and is refused rather than replaced by a file.
  if (const std::string kind = non_regular_kind(path); !kind.empty())
    throw InputError(cat(path, ": exists and is not a regular file (", kind,
                         "); it is left as it is: expected a regular file to replace, or a new path"));
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  int fd = static_cast<int>(
      sys_check(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), "open", tmp));
  for (size_t i = 0; i < count; ++i) {
    std::string_view bytes;
    try {
      bytes = part(i);
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    size_t put = 0;
    while (put < bytes.size()) {
      ssize_t w = ::write(fd, bytes.data() + put, bytes.size() - put);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw RuntimeError(cat("write(", tmp, ") failed: ", std::strerror(err)));
      }
      put += static_cast<size_t>(w);
    }
  }
  const int synced = ::fsync(fd), sync_err = errno;
  const int closed = ::close(fd), close_err = errno;
  if (synced != 0 || closed != 0) {
    ::unlink(tmp.c_str());
    throw RuntimeError(cat(synced != 0 ? "fsync(" : "close(", tmp, ") failed: ", std::strerror(synced != 0 ? sync_err : close_err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw RuntimeError(cat("rename(", tmp, ", ", path, ") failed: ", std::strerror(err)));
  }
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

std::string non_regular_kind(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  return "not a regular file";
}

bool path_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace loom
