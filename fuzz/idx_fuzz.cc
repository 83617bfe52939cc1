// libFuzzer target: the IDX reader (Fashion-MNIST images and labels, gzip or plain), as the
// MLP's training reads them. The input is a 4-byte little-endian length L, then L bytes of
// the image file, then the label file. Properties: no crash; decompression stops at the
// cap (64 MiB here, so a gzip bomb is caught in the fuzzer's memory; the CLI's is 1 GiB);
// a pair that parses has one label per image and pixels in [0, 1]; anything else is an
// InputError naming one of the two files.
#include <cstring>

#include "loom/data/data.h"
#include "reader_checks.h"

using namespace loom;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string images_path = "fuzz/images-idx3-ubyte.gz", labels_path = "fuzz/labels-idx1-ubyte.gz";
  uint32_t split = 0;
  std::memcpy(&split, data, std::min(size, sizeof split));
  const size_t rest = size > sizeof split ? size - sizeof split : 0;
  const char* body = reinterpret_cast<const char*>(data) + (size > sizeof split ? sizeof split : size);
  const size_t image_bytes = std::min<size_t>(split, rest);
  const std::string images(body, image_bytes), labels(body + image_bytes, rest - image_bytes);
  try {
    const data::ImageSet s = data::parse_idx(images_path, images, labels_path, labels, size_t{64} << 20);
    if (s.n <= 0 || s.rows <= 0 || s.cols <= 0) std::abort();
    if (s.labels.size() != static_cast<size_t>(s.n) || s.pixels.size() != static_cast<size_t>(s.n * s.rows * s.cols))
      std::abort();
    for (float p : s.pixels)
      if (!(p >= 0.0f && p <= 1.0f)) std::abort();
  } catch (const InputError& e) {
    const std::string what = e.what();
    fuzz::check_input_error(e, what.find(labels_path) != std::string::npos ? labels_path : images_path);
  }
  return 0;
}
