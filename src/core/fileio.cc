#include "loom/fileio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/error.h"
#include "loom/host.h"

namespace loom {

std::string read_file(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(cat(path, ": not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw InputError(cat(path, ": ", st.st_size, " bytes, over the ", max_bytes, "-byte limit of its format"));
  }
  // Whatever the format allows, a file is read whole only when memory can hold it.
  if (const double room = available_memory_bytes(); static_cast<double>(st.st_size) > room) {
    ::close(fd);
    throw InputError(cat(path, ": ", st.st_size, " bytes, more than the ", static_cast<int64_t>(room),
                         " bytes of memory available to read it into"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t r = ::read(fd, data.data() + got, data.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      ::close(fd);
      throw InputError(cat(path, ": read failed: ", r == 0 ? "file shrank" : std::strerror(err)));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return data;
}

void fsync_dir(const std::string& dir) {
  int fd = static_cast<int>(sys_check(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), "open", dir));
  int rc = ::fsync(fd);
  ::close(fd);
  sys_check(rc, "fsync", dir);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  int fd = static_cast<int>(
      sys_check(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), "open", tmp));
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
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    sys_check(-1, "fsync/close", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw RuntimeError(cat("rename(", tmp, ", ", path, ") failed: ", std::strerror(err)));
  }
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

bool path_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace loom
