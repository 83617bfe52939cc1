// Checked file I/O: every call names the file and the cause in its error (STYLE.md rule 10).
// write_file_atomic writes to "<path>.tmp.<pid>", fsyncs it, renames it over `path` and
// fsyncs the directory, so a reader sees the old file or the new one, never a part; a path
// that holds anything but a regular file (a FIFO, a device, a link) is refused, not replaced.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// Whole file; InputError when missing, not a regular file (a FIFO is refused without
// waiting for a writer), unreadable, larger than `max_bytes` or than the memory available
// (both checked before anything is read: it is the user's file).
std::string read_file(const std::string& path, size_t max_bytes = SIZE_MAX);
// The first `n` bytes of a file (fewer when it is shorter) and its size: read_file's
// checks on the kind of file, none on its size, so a format's header can be checked
// against the file before the whole of it is read.
struct FileHead {
  std::string bytes;
  uint64_t size = 0;
};
FileHead read_file_head(const std::string& path, size_t n);
// A file's bytes in memory of their own: a large file in anonymous memory asking for huge
// pages (a 200 MB read faults 100 pages instead of 50,000), a small one in a string.
// Move-only.
class FileBytes {
 public:
  FileBytes() = default;
  explicit FileBytes(std::string bytes);
  FileBytes(FileBytes&& o) noexcept;
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();
  static FileBytes allocate(size_t size);  // uninitialized (large: zero pages)
  static FileBytes adopt(void* map, size_t size);  // a mapping of `size` bytes, unmapped when done

  char* data() { return map_ != nullptr ? static_cast<char*>(map_) : small_.data(); }
  const char* data() const { return map_ != nullptr ? static_cast<const char*>(map_) : small_.data(); }
  size_t size() const { return size_; }
  std::string_view view() const { return {data(), size_}; }

 private:
  std::string small_;
  void* map_ = nullptr;
  size_t size_ = 0;
};

// read_file's checks and errors, into FileBytes.
FileBytes read_file_bytes(const std::string& path, size_t max_bytes = SIZE_MAX);

void write_file_atomic(const std::string& path, std::string_view bytes);
// The same for bytes in several parts, written one after another (no joined copy).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts);
// The same for `count` parts made as they are written: part(i) is called once, in order, and
// what it returns need stay valid only until the next call (a bounded buffer reused).
void write_file_atomic(const std::string& path, size_t count, const std::function<std::string_view(size_t)>& part);
void fsync_dir(const std::string& dir);
bool path_exists(const std::string& path);
// What is at `path` when it is there and not a regular file ("a FIFO", "a device", "a
// directory", "a socket", "a symbolic link"), for a refusal; "" otherwise. Links not followed.
std::string non_regular_kind(const std::string& path);

}  // namespace loom
