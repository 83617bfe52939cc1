// Sharded token datasets: the manifest, the shards' checks, and windows read from mapped
// shards (include/loom/data/dataset.h, docs/data.md).
#include "loom/data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "json_text.h"

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/sha256.h"
#include "loom/data/shard_cache.h"
#include "loom/data/data.h"

namespace loom::data {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kHeaderBytes = kTokenHeaderWords * sizeof(int32_t);
constexpr int64_t kMaxShardTokens = INT32_MAX;  // llm.c's header counts in an int32

bool is_url(const std::string& s) { return s.starts_with("http://") || s.starts_with("https://"); }

bool is_hex64(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

bool is_manifest(const std::string& path) { return path.ends_with(".json"); }

Manifest read_manifest(const std::string& path) { return parse_manifest(path, read_file(path, size_t{1} << 31)); }

Manifest parse_manifest(const std::string& path, std::string_view text) {
  Manifest m{.path = path};
  auto fail = [&](const std::string& field, const std::string& what) {
    return InputError(cat(path, ": ", field, ": ", what));
  };
  // o[key] when it is an integer in [lo, hi]; else an error naming field(), made only then.
  auto integer = [&](const json& o, const char* key, const auto& field, int64_t lo, int64_t hi) {
    const auto it = o.find(key);
    if (it == o.end() || !it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi)
      throw fail(field(), cat("expected an integer in [", lo, ", ", hi, "]"));
    return it->get<int64_t>();
  };
  // Shard paths resolve against the manifest's directory: `dir / location` as a string.
  const fs::path dir = fs::path(path).parent_path();
  const std::string dir_prefix = dir.empty() ? std::string() : (dir / "").string();
  // The string at `key` of shard object `s`; null when it is absent or not a string.
  auto text_at = [](const json& s, const char* key) -> const std::string* {
    const auto it = s.find(key);
    return it != s.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
  };
  // Each shard is checked and kept as it is parsed, and dropped from the document: a
  // manifest of millions of shards costs their ShardInfo, not a JSON tree of them. A field's
  // name ("shards[7].tokens") is only made for an error: making it for every field was most
  // of the time a manifest of 10^6 shards took to read.
  auto shard = [&](const json& s) {
    const size_t i = m.shards.size();
    auto field = [&](const char* name = "") { return cat("shards[", i, "]", *name ? "." : "", name); };
    if (static_cast<int64_t>(i) >= kMaxShards) throw fail("shards", cat("expected at most ", kMaxShards, " shards"));
    if (!s.is_object()) throw fail(field(), "expected an object {path or url, tokens, dtype, sha256}");
    ShardInfo info;
    const bool has_url = s.contains("url");
    if (has_url == s.contains("path")) throw fail(field(), "expected one of \"path\" and \"url\"");
    const char* key = has_url ? "url" : "path";
    const std::string* location = text_at(s, key);
    if (location == nullptr || location->empty()) throw fail(field(key), "expected a string");
    info.location = *location;
    if (has_url && !is_url(info.location)) throw fail(field("url"), "expected an http:// or https:// URL");
    if (!has_url) info.path = info.location.starts_with('/') ? info.location : dir_prefix + info.location;
    info.tokens = integer(s, "tokens", [&] { return field("tokens"); }, 0, kMaxShardTokens);
    const std::string* dtype = text_at(s, "dtype");
    if (dtype == nullptr || (*dtype != "uint16" && *dtype != "uint32"))
      throw fail(field("dtype"), "expected \"uint16\" or \"uint32\"");
    info.dtype_bytes = *dtype == "uint16" ? 2 : 4;
    const std::string* sha = text_at(s, "sha256");
    if (sha == nullptr || !is_hex64(*sha)) throw fail(field("sha256"), "expected 64 lowercase hex digits");
    info.sha256 = *sha;
    if (s.contains("documents") != s.contains("index_sha256"))
      throw fail(field(), "expected both of \"documents\" and \"index_sha256\" (its document index) or neither");
    if (s.contains("documents")) {
      info.documents = integer(s, "documents", [&] { return field("documents"); }, info.tokens > 0 ? 1 : 0, info.tokens);
      const std::string* index_sha = text_at(s, "index_sha256");
      if (index_sha == nullptr || !is_hex64(*index_sha))
        throw fail(field("index_sha256"), "expected 64 lowercase hex digits");
      info.index_sha256 = *index_sha;
    }
    m.tokens += info.tokens;
    m.shards.push_back(std::move(info));
  };
  std::string top_key;
  std::set<std::string> top_keys, shard_keys;  // a key given twice is refused, not the last one taken
  json j;
  try {
    j = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && (depth == 1 || (depth == 3 && top_key == "shards"))) {
        const std::string key = parsed.get<std::string>();
        if (!(depth == 1 ? top_keys : shard_keys).insert(key).second)
          throw fail(depth == 1 ? key : cat("shards[", m.shards.size(), "].", key), "given twice");
        if (depth == 1) top_key = key;
      }
      if (depth == 2 && top_key == "shards" && event == json::parse_event_t::object_start) shard_keys.clear();
      if (depth == 2 && top_key == "shards" &&
          (event == json::parse_event_t::object_end || event == json::parse_event_t::value ||
           event == json::parse_event_t::array_end)) {
        shard(parsed);
        return false;
      }
      return true;
    });
  } catch (const json::exception& e) {
    throw InputError(cat(path, ": not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) throw InputError(cat(path, ": expected a JSON object (a loom-dataset manifest)"));
  if (string_or_empty(j, "format") != "loom-dataset")
    throw fail("format", "expected \"loom-dataset\" (a manifest written by loom data prepare, docs/data.md)");
  if (!j.contains("version") || j["version"] != 1) throw fail("version", "expected 1");
  if (j.contains("vocab_size")) m.vocab_size = integer(j, "vocab_size", [] { return std::string("vocab_size"); }, 1, int64_t{1} << 32);
  if (j.contains("end_of_text")) m.end_of_text = static_cast<int32_t>(integer(j, "end_of_text", [] { return std::string("end_of_text"); }, 0, INT32_MAX));
  if (j.contains("tokenizer")) {
    if (!j["tokenizer"].is_string()) throw fail("tokenizer", "expected a string");
    m.tokenizer = j["tokenizer"].get<std::string>();
  }
  if (!j.contains("shards") || !j["shards"].is_array() || m.shards.empty())
    throw fail("shards", "expected a non-empty array of shards");
  return m;
}

std::string manifest_json(const Manifest& m) {
  json shards = json::array();
  for (const ShardInfo& s : m.shards) {
    json entry = {{is_url(s.location) ? "url" : "path", s.location},
                  {"tokens", s.tokens},
                  {"dtype", s.dtype_bytes == 2 ? "uint16" : "uint32"},
                  {"sha256", s.sha256}};
    if (s.documents >= 0) {
      entry["documents"] = s.documents;
      entry["index_sha256"] = s.index_sha256;
    }
    shards.push_back(std::move(entry));
  }
  json j = {{"format", "loom-dataset"}, {"version", 1}, {"tokens", m.tokens}};
  if (!m.tokenizer.empty()) j["tokenizer"] = m.tokenizer;
  if (m.vocab_size > 0) j["vocab_size"] = m.vocab_size;
  if (m.end_of_text >= 0) j["end_of_text"] = m.end_of_text;
  j["shards"] = std::move(shards);
  return j.dump(1) + "\n";
}

ShardInfo ShardInfo::index() const {
  LOOM_CHECK(documents >= 0 && !is_index);
  return {.location = location + ".idx", .path = path.empty() ? std::string() : path + ".idx", .tokens = documents,
          .dtype_bytes = 4, .sha256 = index_sha256, .is_index = true};
}

void check_shard(const ShardInfo& s, const std::string& manifest, bool hash) {
  const std::string where = cat(s.path, " (", manifest, ")");
  const FileHead head = read_file_head(s.path, kHeaderBytes);
  if (static_cast<int64_t>(head.size) != s.bytes())
    throw InputError(cat(where, ": ", head.size, " bytes, but the manifest says ", s.tokens, " ",
                         s.is_index ? "documents" : s.dtype_bytes == 2 ? "uint16 tokens" : "uint32 tokens", " (", s.bytes(), " bytes)"));
  int32_t h[3];
  std::memcpy(h, head.bytes.data(), sizeof h);
  const int32_t magic = s.is_index ? kIndexMagic : kTokenMagic;
  const int version = s.is_index || s.dtype_bytes == 2 ? 1 : 2;
  if (h[0] != magic || h[1] != version || h[2] != s.tokens)
    throw InputError(cat(where, ": header (magic ", h[0], ", version ", h[1], ", count ", h[2],
                         ") disagrees with the manifest (magic ", magic, ", version ", version, ", count ", s.tokens, ")"));
  if (!hash) return;
  const std::string got = sha256_file(s.path);
  if (got != s.sha256)
    throw InputError(cat(where, ": SHA-256 ", got, ", but the manifest says ", s.sha256, ": the shard is not the one listed"));
}

namespace {

// Document d's first token, from an index's offsets.
int64_t doc_start(const uint8_t* index, int64_t d) {
  uint32_t v;
  std::memcpy(&v, index + d * 4, 4);
  return v;
}

// Shard s's index in `bytes`: f(d, start, end) for each document; InputError starting with
// `where` when its size, header or offsets are not an index of s.documents documents of
// the shard.
template <typename F>
void parse_index(const ShardInfo& s, const std::string& where, std::string_view bytes, F&& f) {
  const ShardInfo idx = s.index();
  if (static_cast<int64_t>(bytes.size()) != idx.bytes())
    throw InputError(cat(where, ": ", bytes.size(), " bytes, but the manifest says ", s.documents, " documents (", idx.bytes(), " bytes)"));
  int32_t h[3];
  std::memcpy(h, bytes.data(), sizeof h);
  if (h[0] != kIndexMagic || h[1] != 1 || h[2] != s.documents)
    throw InputError(cat(where, ": header (magic ", h[0], ", version ", h[1], ", count ", h[2],
                         ") disagrees with the manifest (magic ", kIndexMagic, ", version 1, count ", s.documents, ")"));
  const auto* starts = reinterpret_cast<const uint8_t*>(bytes.data()) + kHeaderBytes;
  for (int64_t d = 0; d < s.documents; ++d) {
    const int64_t start = doc_start(starts, d), end = d + 1 < s.documents ? doc_start(starts, d + 1) : s.tokens;
    if ((d == 0 && start != 0) || start >= end || end > s.tokens)
      throw InputError(cat(where, ": document ", d, " starts at token ", start, d == 0 && start != 0 ? ", expected 0" : cat(", the next at ", end),
                           ": expected offsets strictly increasing from 0 and below the shard's ", s.tokens, " tokens"));
    f(d, start, end);
  }
}

// The same for the index read from `path` (its own, or its copy in the cache), its size
// checked before it is read.
template <typename F>
void read_index(const ShardInfo& s, const std::string& path, const std::string& manifest, F&& f) {
  const std::string where = cat(s.path.empty() ? redact_url(s.index().location) : path, " (", manifest, ")");
  const FileHead head = read_file_head(path, kHeaderBytes);
  if (static_cast<int64_t>(head.size) != s.index().bytes())
    throw InputError(cat(where, ": ", head.size, " bytes, but the manifest says ", s.documents, " documents (",
                         s.index().bytes(), " bytes)"));
  parse_index(s, where, read_file(path, head.size), f);
}

void require_index(const Manifest& m, size_t i) {
  if (m.shards[i].documents < 0)
    throw InputError(cat(m.path, ": shards[", i, "] (", redact_url(m.shards[i].location),
                         ") has no document index: data.windows = \"documents\" needs one (loom data prepare "
                         "writes it; docs/data.md)"));
}

}  // namespace

void check_index(const ShardInfo& s, const std::string& path, const std::string& manifest) {
  read_index(s, path, manifest, [](int64_t, int64_t, int64_t) {});
}

void check_index_bytes(const ShardInfo& s, const std::string& where, std::string_view bytes) {
  parse_index(s, where, bytes, [](int64_t, int64_t, int64_t) {});
}

bool check_local_shards(const Manifest& m, bool hash, bool indexes) {
  bool remote = false;
  std::set<std::tuple<std::string, int64_t, int, std::string>> seen;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardInfo& s = m.shards[i];
    if (indexes) require_index(m, i);
    if (s.path.empty()) {
      remote = true;
      continue;
    }
    if (seen.emplace(s.path, s.tokens, s.dtype_bytes, s.sha256).second) check_shard(s, m.path, hash);
    if (indexes && seen.emplace(s.path + ".idx", s.documents, 4, s.index_sha256).second) {
      check_shard(s.index(), m.path, hash);
      check_index(s, s.index().path, m.path);
    }
  }
  return remote;
}

// ---- ShardedWindows ------------------------------------------------------------------------

namespace {

// A file mapped read-only.
struct Region {
  void* map = nullptr;
  size_t size = 0;
  Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() {
    if (map != nullptr) ::munmap(map, size);
  }
  const uint8_t* body() const { return static_cast<const uint8_t*>(map) + kHeaderBytes; }
};

}  // namespace

struct ShardedWindows::Mapped {
  Region tokens, index;  // index: kDocuments only
};

std::string ShardedWindows::local_path(const ShardInfo& s) const {
  return s.path.empty() ? cache_->fetch(s, m_.path) : s.path;
}

ShardedWindows::ShardedWindows(Manifest m, int64_t t, int64_t vocab, std::shared_ptr<ShardCache> cache, Windows mode)
    : m_(std::move(m)), t_(t), vocab_(vocab), mode_(mode), cache_(std::move(cache)) {
  LOOM_CHECK(t > 0);
  first_window_.reserve(m_.shards.size() + 1);
  int64_t largest = 1;
  for (size_t i = 0; i < m_.shards.size(); ++i) {
    const ShardInfo& s = m_.shards[i];
    first_window_.push_back(windows_);
    if (s.path.empty()) {
      LOOM_CHECK(cache_ != nullptr);
      largest = std::max(largest, s.bytes());
    }
    if (mode_ == Windows::kTokens) {
      windows_ += s.tokens > 0 ? (s.tokens - 1) / t_ : 0;
      continue;
    }
    // Every window of every document is counted now, from the index read through once.
    require_index(m_, i);
    std::vector<int64_t>& blocks = doc_blocks_.emplace_back();
    blocks.reserve(static_cast<size_t>((s.documents + kDocBlock - 1) / kDocBlock));
    int64_t in_shard = 0;
    read_index(s, local_path(s.index()), m_.path, [&](int64_t d, int64_t start, int64_t end) {
      if (d % kDocBlock == 0) blocks.push_back(in_shard);
      in_shard += doc_windows(start, end, s.tokens);
    });
    windows_ += in_shard;
  }
  first_window_.push_back(windows_);
  mapped_.resize(m_.shards.size());
  if (cache_) max_remote_mapped_ = static_cast<size_t>(std::max<int64_t>(2, cache_->options().max_bytes / largest / 2));
}

ShardedWindows::~ShardedWindows() = default;

int64_t ShardedWindows::doc_windows(int64_t start, int64_t end, int64_t tokens) const {
  if (start + t_ >= tokens) return 0;
  return std::min((end - start + t_ - 1) / t_, (tokens - 1 - t_ - start) / t_ + 1);
}

int64_t ShardedWindows::window_offset(size_t s, int64_t w, const Mapped& held) const {
  if (mode_ == Windows::kTokens) return w * t_;
  const ShardInfo& info = m_.shards[s];
  const std::vector<int64_t>& blocks = doc_blocks_[s];
  const auto b = static_cast<int64_t>(std::upper_bound(blocks.begin(), blocks.end(), w) - blocks.begin() - 1);
  const uint8_t* starts = held.index.body();
  int64_t before = blocks[static_cast<size_t>(b)];
  for (int64_t d = b * kDocBlock; d < info.documents; ++d) {
    const int64_t start = doc_start(starts, d), end = d + 1 < info.documents ? doc_start(starts, d + 1) : info.tokens;
    const int64_t n = doc_windows(start, end, info.tokens);
    if (w < before + n) return start + (w - before) * t_;
    before += n;
  }
  LOOM_CHECK(false);
  return 0;
}

int64_t ShardedWindows::shards_mapped() const {
  std::lock_guard lock(mu_);
  return std::count_if(mapped_.begin(), mapped_.end(), [](const auto& p) { return p != nullptr; });
}

namespace {

// Maps a shard or its index (fetched into `cache` first when remote).
void map_file(const ShardInfo& info, ShardCache* cache, const std::string& manifest, Region& into) {
  int fd = -1;
  const bool remote = info.path.empty();
  std::string path = info.path;
  for (int attempt = 0; fd < 0 && attempt < 2; ++attempt) {
    if (remote) path = cache->fetch(info, manifest);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && !(remote && errno == ENOENT))  // a cached copy evicted meanwhile is fetched again
      throw InputError(cat(path, " (", manifest, "): cannot open (", std::strerror(errno), ")"));
  }
  if (fd < 0) throw RuntimeError(cat(path, " (", manifest, "): removed from the cache as soon as it was fetched"));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size != info.bytes()) {
    ::close(fd);
    throw InputError(cat(path, " (", manifest, "): ", st.st_size, " bytes, but the manifest says ", info.bytes(),
                         ": the file changed since it was checked"));
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(info.bytes()), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw RuntimeError(cat("mmap(", path, ") failed: ", std::strerror(err)));
  ::madvise(p, static_cast<size_t>(info.bytes()), MADV_RANDOM);  // windows are drawn anywhere: no read-ahead
  into.map = p;
  into.size = static_cast<size_t>(info.bytes());
}

}  // namespace

std::shared_ptr<const ShardedWindows::Mapped> ShardedWindows::shard(size_t s) const {
  std::lock_guard lock(mu_);
  const ShardInfo& info = m_.shards[s];
  const bool remote = info.path.empty();
  if (remote) {  // most recently used last
    std::erase(remote_mapped_, s);
    remote_mapped_.push_back(s);
  }
  if (mapped_[s]) return mapped_[s];
  auto mapped = std::make_shared<Mapped>();
  map_file(info, cache_.get(), m_.path, mapped->tokens);
  if (mode_ == Windows::kDocuments) map_file(info.index(), cache_.get(), m_.path, mapped->index);
  mapped_[s] = mapped;
  // Remote shards beyond what the cache can hold are let go (a batch still reading one
  // keeps it until it is done), so the cache's disk space is not held by old mappings.
  while (remote && remote_mapped_.size() > max_remote_mapped_) {
    mapped_[remote_mapped_.front()].reset();
    remote_mapped_.erase(remote_mapped_.begin());
  }
  return mapped;
}

Batch ShardedWindows::batch(std::span<const int64_t> windows) const {
  const auto b = static_cast<int64_t>(windows.size());
  Batch out{Tensor::zeros({b, t_}, DType::kI32), Tensor::zeros({b, t_}, DType::kI32)};
  int32_t* x = out.inputs.data<int32_t>();
  int32_t* y = out.targets.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t w = windows[static_cast<size_t>(i)];
    LOOM_CHECK(w >= 0 && w < windows_);
    const auto s = static_cast<size_t>(std::upper_bound(first_window_.begin(), first_window_.end(), w) - first_window_.begin() - 1);
    const ShardInfo& info = m_.shards[s];
    const std::shared_ptr<const Mapped> held = shard(s);
    const int64_t offset = window_offset(s, w - first_window_[s], *held);
    const uint8_t* base = held->tokens.body() + offset * info.dtype_bytes;
    for (int64_t j = 0; j <= t_; ++j) {
      uint32_t id;
      if (info.dtype_bytes == 2) {
        uint16_t v;
        std::memcpy(&v, base + j * 2, 2);
        id = v;
      } else {
        std::memcpy(&id, base + j * 4, 4);
      }
      if (static_cast<int64_t>(id) >= vocab_)
        throw InputError(cat(info.path.empty() ? redact_url(info.location) : info.path, " (", m_.path, "): token ", offset + j, " is id ", id,
                             ", outside the model's vocabulary (model.vocab_size = ", vocab_, ")"));
      if (j < t_) x[i * t_ + j] = static_cast<int32_t>(id);
      if (j > 0) y[i * t_ + j - 1] = static_cast<int32_t>(id);
    }
  }
  return out;
}

}  // namespace loom::data
