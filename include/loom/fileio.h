// Checked file I/O: every call names the file and the cause in its error (STYLE.md rule 10).
// write_file_atomic writes to "<path>.tmp.<pid>", fsyncs it, renames it over `path` and
// fsyncs the directory, so a reader sees the old file or the new one, never a part.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <cstddef>
#include <string>
#include <string_view>

namespace loom {

// Whole file; InputError when missing, not a regular file (a FIFO is refused without
// waiting for a writer), unreadable, larger than `max_bytes` or than the memory available
// (both checked before anything is read: it is the user's file).
std::string read_file(const std::string& path, size_t max_bytes = SIZE_MAX);
void write_file_atomic(const std::string& path, std::string_view bytes);
void fsync_dir(const std::string& dir);
bool path_exists(const std::string& path);

}  // namespace loom
