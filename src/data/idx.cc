#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "loom/data/data.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom::data {
namespace {

// `in` (read from `path`) gunzipped when it starts with the gzip magic, as it is otherwise;
// refuses output past `cap` bytes.
std::string maybe_gunzip(const std::string& path, const std::string& in, size_t cap) {
  if (in.size() < 2 || static_cast<unsigned char>(in[0]) != 0x1f || static_cast<unsigned char>(in[1]) != 0x8b) return in;
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw RuntimeError(cat(path, ": zlib inflateInit2 failed"));
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(std::min<size_t>(in.size(), UINT32_MAX));
  std::string out;
  int rc = Z_OK;
  while (rc == Z_OK) {
    if (out.size() >= cap) {
      inflateEnd(&z);
      throw InputError(cat(path, ": decompresses to more than ", cap, " bytes, over the limit for an IDX file"));
    }
    const size_t have = out.size();
    out.resize(std::min(cap + 1, std::max<size_t>(2 * have, 1 << 16)));
    z.next_out = reinterpret_cast<Bytef*>(out.data() + have);
    z.avail_out = static_cast<uInt>(out.size() - have);
    rc = inflate(&z, Z_NO_FLUSH);
    out.resize(out.size() - z.avail_out);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // input ended inside the stream
    if (rc == Z_BUF_ERROR) rc = Z_OK;                 // only out of room: go on
  }
  const bool whole = rc == Z_STREAM_END;
  const std::string why = z.msg != nullptr ? z.msg : "the gzip stream ends early";
  inflateEnd(&z);
  if (!whole) throw InputError(cat(path, ": corrupt gzip data: ", why));
  return out;
}

uint32_t be32(const std::string& b, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + at);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Validates an unsigned-byte IDX header with `ndims` dimensions and returns them.
std::vector<int64_t> idx_dims(const std::string& b, const std::string& path, int ndims) {
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (b.size() < header)
    throw InputError(cat(path, ": truncated IDX file: ", b.size(), " bytes, header needs ", header));
  const uint32_t magic = be32(b, 0);
  const uint32_t want = 0x0800u | static_cast<uint32_t>(ndims);
  if (magic != want)
    throw InputError(cat(path, ": bad IDX magic 0x", std::hex, magic, ", expected 0x", want,
                         " (unsigned bytes, ", std::dec, ndims, " dimensions)"));
  std::vector<int64_t> dims;
  int64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    dims.push_back(be32(b, 4 + 4 * static_cast<size_t>(i)));
    if (dims.back() == 0) throw InputError(cat(path, ": IDX dimension ", i, " is 0; expected at least one item and pixel"));
    if (dims.back() > (int64_t{1} << 34) / total) throw InputError(cat(path, ": IDX dimensions too large"));
    total *= dims.back();
  }
  if (b.size() != header + static_cast<size_t>(total))
    throw InputError(cat(path, ": IDX size mismatch: header says ", total, " data bytes, file has ",
                         b.size() - header));
  return dims;
}

}  // namespace

ImageSet read_idx(const std::string& images_path, const std::string& labels_path) {
  // read_file refuses what is not a regular file (a FIFO or /dev/zero would never end).
  return parse_idx(images_path, read_file(images_path, kMaxIdxBytes), labels_path,
                   read_file(labels_path, kMaxIdxBytes));
}

ImageSet parse_idx(const std::string& images_path, const std::string& images, const std::string& labels_path,
                   const std::string& labels, size_t max_bytes) {
  const std::string ib = maybe_gunzip(images_path, images, max_bytes);
  const std::string lb = maybe_gunzip(labels_path, labels, max_bytes);
  auto idims = idx_dims(ib, images_path, 3);
  auto ldims = idx_dims(lb, labels_path, 1);
  if (idims[0] != ldims[0])
    throw InputError(cat(labels_path, ": ", ldims[0], " labels for ", idims[0], " images in ", images_path));
  ImageSet s{.n = idims[0], .rows = idims[1], .cols = idims[2]};
  const size_t px = static_cast<size_t>(s.n * s.rows * s.cols);
  s.pixels.resize(px);
  const auto* src = reinterpret_cast<const unsigned char*>(ib.data() + 16);
  for (size_t i = 0; i < px; ++i) s.pixels[i] = static_cast<float>(src[i]) * (1.0f / 255.0f);
  s.labels.resize(static_cast<size_t>(s.n));
  for (int64_t i = 0; i < s.n; ++i) s.labels[i] = static_cast<unsigned char>(lb[8 + i]);
  return s;
}

ImageSet load_fashion_mnist(const std::string& dir, bool train) {
  const std::string pre = dir + (train ? "/train" : "/t10k");
  return read_idx(pre + "-images-idx3-ubyte.gz", pre + "-labels-idx1-ubyte.gz");
}

}  // namespace loom::data
