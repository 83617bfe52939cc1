#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "loom/data/data.h"
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

Sampler::Sampler(int64_t items, uint64_t seed, Order order) : items_(items), seed_(seed), order_(order) {
  LOOM_CHECK(items > 0);
}

namespace {
uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Index i of [0, n) permuted by a 4-round Feistel network keyed by (seed, epoch) over
// [0, 4^half) >= n, applied again while the result is out of range (cycle walking: a
// permutation of [0, n), at most 4 rounds on average).
int64_t feistel(int64_t i, int64_t n, uint64_t seed, int64_t epoch) {
  int half = 1;
  while ((int64_t{1} << (2 * half)) < n) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t keys[4];
  for (int r = 0; r < 4; ++r) keys[r] = mix64(seed ^ mix64(static_cast<uint64_t>(epoch) * 4 + static_cast<uint64_t>(r) + 1));
  auto x = static_cast<uint64_t>(i);
  do {
    uint64_t l = x >> half, rr = x & mask;
    for (uint64_t key : keys) {
      const uint64_t f = mix64(rr ^ key) & mask;
      const uint64_t next_l = rr;
      rr = l ^ f;
      l = next_l;
    }
    x = (l << half) | rr;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}
}  // namespace

int64_t Sampler::item(int64_t global_index) {
  const int64_t epoch = global_index / items_;
  if (order_ == Order::kFeistel) return feistel(global_index % items_, items_, seed_, epoch);
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
