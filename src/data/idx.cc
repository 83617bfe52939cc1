#include <zlib.h>

#include <cstring>

#include "loom/data.h"
#include "loom/error.h"

namespace loom::data {
namespace {

// Whole file through zlib, which reads gzip and plain files alike.
std::string read_maybe_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw InputError(cat(path, ": cannot open (expected an IDX file, gzip or plain)"));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string what = (n < 0 || err < 0) ? std::string(msg) : "";
  gzclose(f);
  if (!what.empty()) throw InputError(cat(path, ": corrupt gzip data: ", what));
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
    total *= dims.back();
    if (total > (int64_t{1} << 34)) throw InputError(cat(path, ": IDX dimensions too large"));
  }
  if (b.size() != header + static_cast<size_t>(total))
    throw InputError(cat(path, ": IDX size mismatch: header says ", total, " data bytes, file has ",
                         b.size() - header));
  return dims;
}

}  // namespace

ImageSet read_idx(const std::string& images_path, const std::string& labels_path) {
  const std::string ib = read_maybe_gzip(images_path);
  const std::string lb = read_maybe_gzip(labels_path);
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
