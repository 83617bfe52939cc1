// The safetensors format (docs/formats.md): an 8-byte little-endian header length N, N
// bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes, offsets relative to the
// byte after the header. Readable by Python's safetensors and Hugging Face.
//
// open() validates everything before any tensor is used, and before the data is read: the
// header length against the file, the JSON, every dtype, every shape against its byte extent, extents within the
// file, and no overlaps or holes. Errors are InputError naming the file and the tensor.
// Thread-safety: a SafetensorsFile is immutable after open(); reads are thread-safe.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/fileio.h"
#include "loom/core/sha256.h"  // sha256_hex: the hashes write_safetensors returns and indexes record
#include "loom/core/tensor.h"

namespace loom {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  // Parses bytes the caller already read from `path` (e.g. to verify their hash first).
  static SafetensorsFile parse(const std::string& path, std::string bytes);
  static SafetensorsFile parse(const std::string& path, FileBytes bytes);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The tensor's elements converted to f32 or f64 (from F32, F64, BF16 or F16), written
  // into `out`. REQUIRES: out contiguous, numel equal. Throws InputError for other dtypes.
  void read_into(const SafetensorsEntry& e, const Tensor& out) const;
  // The tensor's raw bytes in the file.
  std::string_view bytes_of(const SafetensorsEntry& e) const;
  // The floating-point tensors holding NaN or Inf, in header order, with how many such
  // elements each holds.
  std::vector<std::pair<std::string, int64_t>> nonfinite() const;

 private:
  // The header's length from the file's first 8 bytes, checked against its size and limit.
  static uint64_t header_length(const std::string& path, std::string_view head, uint64_t file_size);
  // Fills entries_ and metadata_ from the header's JSON, checked against the data's size.
  void parse_header(std::string_view text, uint64_t data_size);

  std::string path_;
  FileBytes bytes_;
  size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct WrittenFile {
  size_t bytes = 0;
  std::string sha256;  // hex, of exactly the bytes written
};

// Writes tensors (contiguous) under their names, atomically.
WrittenFile write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// The same for tensors whose bytes are made as they are written: bytes_of(i) is called once
// per tensor, in order, and returns its dtype_size x numel(shape) bytes, valid until the
// next call (so that a file larger than the memory left can be written through one buffer).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};
WrittenFile write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                              const std::function<std::string_view(size_t)>& bytes_of,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace loom
