// libFuzzer target: the safetensors reader (model.safetensors, optimizer.safetensors and
// any file handed to --checkpoint). The input is a whole file. Properties: no crash and no
// read past the input; a file that parses has every tensor's bytes inside the data
// section, its byte extent equal to its shape times its dtype, and reads back into f32 and
// f64; anything else is an InputError naming the file.
#include "loom/checkpoint/safetensors.h"
#include "reader_checks.h"

using namespace loom;

namespace {

const std::string kPath = "fuzz/model.safetensors";

// The element count of a shape whose extent the reader already checked (a zero dimension
// first, so that [2^40, 2^40, 0] does not overflow here).
int64_t numel(const Shape& shape) {
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const SafetensorsFile f = SafetensorsFile::parse(kPath, bytes);
    size_t covered = 0;
    for (const SafetensorsEntry& e : f.entries()) {
      if (e.begin > e.end || e.end > size) std::abort();
      const int64_t n = numel(e.shape);
      if (static_cast<size_t>(n) * dtype_size(e.dtype) != e.end - e.begin) std::abort();
      covered += e.end - e.begin;
      if (f.find(e.name) != &e) std::abort();
      if (e.dtype != DType::kF32 && e.dtype != DType::kF64 && e.dtype != DType::kBF16 && e.dtype != DType::kF16) continue;
      for (DType to : {DType::kF32, DType::kF64}) {
        Tensor out = Tensor::zeros({n}, to);
        f.read_into(e, out);
      }
    }
    if (covered > size) std::abort();
    for (const auto& [name, count] : f.nonfinite())
      if (count <= 0 || f.find(name) == nullptr) std::abort();
  } catch (const InputError& e) {
    fuzz::check_input_error(e, kPath);
  }
  return 0;
}
