#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "loom/data/data.h"
#include "loom/data/tokenizer.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/rng.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

constexpr size_t kHeader = kTokenHeaderWords * sizeof(int32_t);

// The token count a file's header gives, checked against the file's size; `head` holds
// the file's first bytes (the whole header when the file has one).
size_t checked_count(const std::string& path, std::string_view head, uint64_t file_size) {
  if (file_size < kHeader || head.size() < kHeader)
    throw InputError(cat(path, ": truncated token file: ", file_size, " bytes, expected a ",
                         kHeader, "-byte header (llm.c format)"));
  int32_t header[kTokenHeaderWords];
  std::memcpy(header, head.data(), kHeader);
  if (header[0] != kTokenMagic)
    throw InputError(cat(path, ": not a token file: magic ", header[0], ", expected ", kTokenMagic,
                         " (llm.c format; make one with `loom data prepare`)"));
  if (header[1] != kTokenVersion)
    throw InputError(cat(path, ": token file version ", header[1], ", expected ", kTokenVersion));
  if (header[2] < 0)
    throw InputError(cat(path, ": negative token count ", header[2]));
  const size_t count = static_cast<size_t>(header[2]);
  const uint64_t want = kHeader + count * sizeof(uint16_t);
  if (file_size != want)
    throw InputError(cat(path, ": ", file_size < want ? "truncated" : "oversized",
                         " token file: header says ", count, " tokens (", want, " bytes), file has ",
                         file_size, " bytes"));
  return count;
}

}  // namespace

std::vector<uint16_t> read_tokens(const std::string& path) {
  // The header is checked against the file's size before the tokens are read: a file its
  // header does not describe (a huge sparse one, say) is refused without reading it.
  const FileHead head = read_file_head(path, kHeader);
  checked_count(path, head.bytes, head.size);
  return parse_tokens(path, read_file(path, head.size));
}

std::vector<uint16_t> parse_tokens(const std::string& path, std::string_view bytes) {
  const size_t count = checked_count(path, bytes, bytes.size());
  std::vector<uint16_t> tokens(count);
  if (count > 0) std::memcpy(tokens.data(), bytes.data() + kHeader, count * sizeof(uint16_t));
  return tokens;
}

void write_tokens(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw InputError(cat(path, ": ", tokens.size(), " tokens exceed the format's int32 count"));
  int32_t header[kTokenHeaderWords] = {};
  header[0] = kTokenMagic;
  header[1] = kTokenVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(sizeof(header) + tokens.size_bytes(), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  if (!tokens.empty()) std::memcpy(bytes.data() + sizeof(header), tokens.data(), tokens.size_bytes());
  write_file_atomic(path, bytes);
}

std::vector<uint16_t> byte_tokenize(std::string_view text) {
  std::vector<uint16_t> out(text.size());
  std::transform(text.begin(), text.end(), out.begin(),
                 [](char ch) { return static_cast<uint16_t>(static_cast<unsigned char>(ch)); });
  return out;
}

std::string byte_detokenize(std::span<const int32_t> tokens) {
  std::string s;
  s.reserve(tokens.size());
  for (int32_t t : tokens) s.push_back(static_cast<char>(t & 0xff));
  return s;
}

std::string val_path_for(const std::string& out) {
  fs::path p(out);
  std::string stem = p.extension() == ".bin" ? p.stem().string() : p.filename().string();
  return (p.parent_path() / (stem + "_val.bin")).string();
}

namespace {
bool looks_binary(const std::string& bytes) {
  return std::memchr(bytes.data(), '\0', std::min<size_t>(bytes.size(), 4096)) != nullptr;
}

// The files a "text:PATH" source names, in a stable order.
std::vector<fs::path> source_files(const std::string& source) {
  if (!source.starts_with("text:"))
    throw InputError(cat("data source \"", source, "\": expected text:PATH"));
  fs::path p(source.substr(5));
  std::error_code ec;
  if (!fs::exists(p, ec)) throw InputError(cat(p.string(), ": no such file or directory (", source, ")"));
  if (!fs::is_directory(p, ec)) return {p};
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(p, ec))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}
}  // namespace

std::vector<TextFile> read_text_sources(const std::vector<std::string>& sources) {
  if (sources.empty()) throw InputError("expected at least one text:PATH source");
  std::vector<TextFile> out;
  std::set<fs::path> seen;
  for (const std::string& source : sources) {
    for (const fs::path& f : source_files(source)) {
      if (!seen.insert(fs::canonical(f)).second) continue;  // e.g. cookie.u8 -> cookie
      std::string text = read_file(f.string());
      if (looks_binary(text)) continue;
      out.push_back({f.string(), std::move(text)});
    }
  }
  return out;
}

PrepareResult prepare_text(const std::vector<std::string>& sources, const std::string& out, double val_fraction,
                           Tokenizer tokenizer) {
  if (sources.empty()) throw InputError("data prepare: expected at least one text:PATH source");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw InputError(cat("data prepare: --val-fraction ", val_fraction, ": expected [0, 1)"));
  if (tokenizer.vocab_size() > 65536)
    throw InputError(cat("data prepare: tokenizer ", tokenizer.spec(), " has ", tokenizer.vocab_size(),
                         " ids; token files hold uint16 ids (at most 65536)"));
  PrepareResult r{.train_path = out, .val_path = val_path_for(out)};
  std::vector<uint16_t> train, val;
  std::vector<int32_t> ids;
  for (const TextFile& file : read_text_sources(sources)) {
    // The split falls on a byte offset, moved to the start of a line so no word is cut.
    auto split = static_cast<size_t>(static_cast<double>(file.text.size()) * (1.0 - val_fraction));
    if (split < file.text.size()) {
      const size_t line = file.text.rfind('\n', split);
      split = line == std::string::npos || tokenizer.is_bytes() ? split : line + 1;
    }
    for (auto [part, into] : {std::pair{std::string_view(file.text).substr(0, split), &train},
                              std::pair{std::string_view(file.text).substr(split), &val}}) {
      ids.clear();
      tokenizer.encode(part, ids);
      for (int32_t id : ids) into->push_back(static_cast<uint16_t>(id));
    }
    ++r.files;
  }
  if (train.empty()) throw InputError("data prepare: the sources hold no text");
  fs::path parent = fs::path(out).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  write_tokens(r.train_path, train);
  write_tokens(r.val_path, val);
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());
  return r;
}

Sampler::Sampler(int64_t items, uint64_t seed) : items_(items), seed_(seed) {
  LOOM_CHECK(items > 0);
}

int64_t Sampler::item(int64_t global_index) {
  const int64_t epoch = global_index / items_;
  if (epoch != epoch_) {
    perm_.resize(items_);
    for (int64_t i = 0; i < items_; ++i) perm_[i] = i;
    Rng rng(seed_, /*stream=*/1000 + static_cast<uint64_t>(epoch));
    for (int64_t i = items_ - 1; i > 0; --i)  // Fisher-Yates
      std::swap(perm_[i], perm_[rng.below(static_cast<uint64_t>(i + 1))]);
    epoch_ = epoch;
  }
  return perm_[global_index % items_];
}

}  // namespace loom::data
