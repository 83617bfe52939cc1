#include "loom/checkpoint/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/bounded_json.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom {
namespace {
using json = nlohmann::json;
}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // The header is read and checked against the file's size first: a file whose header does
  // not describe it (a huge sparse file, a wrong length) is refused before its data is read.
  const FileHead head = read_file_head(path, 8);
  const uint64_t n = header_length(path, head.bytes, head.size);
  SafetensorsFile probe;
  probe.path_ = path;
  probe.parse_header(read_file_head(path, 8 + n).bytes.substr(8), head.size - 8 - n);
  return parse(path, read_file_bytes(path, head.size));
}

SafetensorsFile SafetensorsFile::parse(const std::string& path, std::string bytes) {
  return parse(path, FileBytes(std::move(bytes)));
}

SafetensorsFile SafetensorsFile::parse(const std::string& path, FileBytes bytes) {
  SafetensorsFile f;
  f.path_ = path;
  f.bytes_ = std::move(bytes);
  const std::string_view b = f.bytes_.view();
  const uint64_t n = header_length(path, b, b.size());
  f.data_start_ = 8 + n;
  f.parse_header(b.substr(8, n), b.size() - f.data_start_);
  return f;
}

uint64_t SafetensorsFile::header_length(const std::string& path, std::string_view head, uint64_t file_size) {
  if (head.size() < 8 || file_size < 8)
    throw InputError(cat(path, ": not safetensors: ", file_size, " bytes, expected an 8-byte header length"));
  uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  if (n > file_size - 8)
    throw InputError(cat(path, ": safetensors header length ", n, " runs past the file (", file_size, " bytes)"));
  if (n > kSafetensorsHeaderLimits.max_bytes)
    throw InputError(cat(path, ": safetensors header length ", n, " is over the ", kSafetensorsHeaderLimits.max_bytes,
                         "-byte limit"));
  return n;
}

void SafetensorsFile::parse_header(std::string_view text, uint64_t data_size) {
  const std::string& path = path_;
  const json header = parse_json_bounded(text, cat(path, ": safetensors header"), kSafetensorsHeaderLimits);
  if (!header.is_object()) throw InputError(cat(path, ": safetensors header is not a JSON object"));
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw InputError(cat(path, ": __metadata__ must be an object of strings"));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw InputError(cat(path, ": __metadata__.", m.key(), " must be a string"));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return InputError(cat(path, ": tensor ", name, ": ", what)); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw bad("expected {dtype, shape, data_offsets}");
    if (!v["dtype"].is_string()) throw bad("dtype must be a string");
    auto dt = dtype_from_safetensors(v["dtype"].get<std::string>());
    if (!dt) throw bad(cat("unsupported dtype ", v["dtype"].get<std::string>()));
    SafetensorsEntry e{.name = name, .dtype = *dt};
    if (!v["shape"].is_array()) throw bad("shape must be an array");
    uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t{1} << 40) || (dim != 0 && numel > (uint64_t{1} << 40) / dim)) throw bad("shape too large");
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("data_offsets must be [begin, end]");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      throw bad(cat("data_offsets [", e.begin, ", ", e.end, "] run past the end of the data (", data_size, " bytes)"));
    if (e.end - e.begin != numel * dtype_size(e.dtype))
      throw bad(cat("shape ", shape_str(e.shape), " ", v["dtype"].get<std::string>(), " needs ",
                    numel * dtype_size(e.dtype), " bytes, data_offsets give ", e.end - e.begin));
    entries_.push_back(std::move(e));
  }
  // Extents must tile the data section exactly: no overlap, no hole (as the reference reader).
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  size_t pos = 0;
  for (const auto* e : order) {
    if (e->begin != pos)
      throw InputError(cat(path, ": tensor ", e->name, " starts at byte ", e->begin, ", expected ", pos,
                           e->begin < pos ? " (overlap)" : " (hole)"));
    pos = e->end;
  }
  if (pos != data_size) throw InputError(cat(path, ": ", data_size - pos, " bytes after the last tensor"));
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void SafetensorsFile::read_into(const SafetensorsEntry& e, const Tensor& out) const {
  LOOM_CHECK(out.is_contiguous());
  LOOM_CHECK_EQ(out.numel(), shape_numel(e.shape));
  const std::byte* src = reinterpret_cast<const std::byte*>(bytes_.data() + data_start_ + e.begin);
  const int64_t n = out.numel();
  auto convert = [&](auto* dst) {
    using T = std::remove_pointer_t<decltype(dst)>;
    for (int64_t i = 0; i < n; ++i) {
      switch (e.dtype) {
        case DType::kF32: { float v; std::memcpy(&v, src + 4 * i, 4); dst[i] = static_cast<T>(v); break; }
        case DType::kF64: { double v; std::memcpy(&v, src + 8 * i, 8); dst[i] = static_cast<T>(v); break; }
        case DType::kBF16: { uint16_t v; std::memcpy(&v, src + 2 * i, 2); dst[i] = static_cast<T>(bf16_to_f32(v)); break; }
        case DType::kF16: { uint16_t v; std::memcpy(&v, src + 2 * i, 2); dst[i] = static_cast<T>(f16_to_f32(v)); break; }
        default: throw InputError(cat(path_, ": tensor ", e.name, ": dtype ", safetensors_dtype_name(e.dtype), " is not a float type"));
      }
    }
  };
  if (out.dtype() == e.dtype) {
    std::memcpy(out.raw(), src, e.end - e.begin);
  } else if (out.dtype() == DType::kF32) {
    convert(out.data<float>());
  } else if (out.dtype() == DType::kF64) {
    convert(out.data<double>());
  } else {
    throw InputError(cat(path_, ": tensor ", e.name, ": cannot convert ", safetensors_dtype_name(e.dtype),
                         " to ", dtype_name(out.dtype())));
  }
}

std::string_view SafetensorsFile::bytes_of(const SafetensorsEntry& e) const {
  return bytes_.view().substr(data_start_ + e.begin, e.end - e.begin);
}

std::vector<std::pair<std::string, int64_t>> SafetensorsFile::nonfinite() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const SafetensorsEntry& e : entries_) {
    const char* src = bytes_.data() + data_start_ + e.begin;
    const auto n = static_cast<int64_t>((e.end - e.begin) / std::max<size_t>(1, dtype_size(e.dtype)));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      switch (e.dtype) {
        case DType::kF32: { float v; std::memcpy(&v, src + 4 * i, 4); bad += !std::isfinite(v); break; }
        case DType::kF64: { double v; std::memcpy(&v, src + 8 * i, 8); bad += !std::isfinite(v); break; }
        case DType::kBF16: { uint16_t v; std::memcpy(&v, src + 2 * i, 2); bad += (v & 0x7f80) == 0x7f80; break; }
        case DType::kF16: { uint16_t v; std::memcpy(&v, src + 2 * i, 2); bad += (v & 0x7c00) == 0x7c00; break; }
        default: i = n; break;  // integers are always finite
      }
    }
    if (bad > 0) out.emplace_back(e.name, bad);
  }
  return out;
}

WrittenFile write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(t.is_contiguous());
    specs.push_back({name, t.dtype(), t.shape()});
  }
  // Written and hashed from where the tensors are: no copy of the file in memory.
  return write_safetensors(path, specs, [&](size_t i) {
    return std::string_view(static_cast<const char*>(tensors[i].second.raw()), tensors[i].second.nbytes());
  }, metadata);
}

namespace {
// SHA-256 over bytes given in parts (OpenSSL).
}  // namespace

WrittenFile write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                              const std::function<std::string_view(size_t)>& bytes_of,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const size_t bytes = static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  const uint64_t n = h.size();
  std::string head(8, '\0');
  std::memcpy(head.data(), &n, 8);
  head += h;
  Sha256 sha;
  write_file_atomic(path, tensors.size() + 1, [&](size_t i) {
    std::string_view part = head;
    if (i > 0) {
      part = bytes_of(i - 1);
      const TensorSpec& t = tensors[i - 1];
      LOOM_CHECK_EQ(part.size(), static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype));
    }
    sha.add(part);
    return part;
  });
  return {head.size() + offset, sha.hex()};
}




}  // namespace loom
