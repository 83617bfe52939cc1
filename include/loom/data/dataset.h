// Sharded token datasets (docs/data.md, "Datasets"): a manifest (JSON) names token shards,
// each an llm.c token file (uint16 ids, version 1, or uint32, version 2) with its token
// count and SHA-256 and, optionally, a document index beside it; any number of shards,
// 64-bit counts in all. Training draws windows of T tokens (from every T tokens, or from
// each document's start) through a seeded permutation of all windows that no world size
// or layout changes, so a checkpoint's data cursor resumes anywhere. A rank maps the
// shards it reads and touches only the pages of the windows it draws.
// Thread-safety: a Manifest is a value; ShardedWindows' const methods may be called from
// any thread (shards are mapped once, under a lock).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/data/examples.h"

namespace loom::data {

struct ShardInfo {
  std::string location;   // as the manifest gives it: a path (relative to the manifest) or an http(s) URL
  std::string path;       // where it is read from: the path resolved, or its copy in the cache
  int64_t tokens = 0;
  int dtype_bytes = 2;    // 2: uint16 (llm.c version 1), 4: uint32 (version 2)
  std::string sha256;     // 64 lowercase hex digits
  // Its document index (`<shard>.idx`, written by `data prepare`): -1 when there is none.
  int64_t documents = -1;
  std::string index_sha256;
  bool is_index = false;  // this entry is a shard's index (from index()), not a shard
  int64_t bytes() const { return 1024 + tokens * dtype_bytes; }
  // The shard's index as an entry of its own: location and path with ".idx" added, one
  // uint32 per document (in `tokens`) after the same 1,024-byte header.
  ShardInfo index() const;
};

// A document index: a 1,024-byte header of int32 (magic, version 1, the count) and then
// `count` uint32 offsets, strictly increasing from 0, of the tokens where a document starts
// in the shard (0 always: a document carried over from the shard before goes on there).
constexpr int32_t kIndexMagic = 20261126;

struct Manifest {
  std::string path;  // the manifest file
  std::vector<ShardInfo> shards;
  int64_t tokens = 0;      // in all shards
  int64_t vocab_size = 0;  // ids are below it (0: not said)
  int32_t end_of_text = -1;  // the id that ends each document (-1: none said)
  std::string tokenizer;   // what made the ids, as `data prepare` was told (informational)
};

// Reads and checks a manifest: every field's type and range, at least one shard, no more
// than kMaxShards; InputError naming the file and the field.
inline constexpr int64_t kMaxShards = int64_t{1} << 24;
Manifest read_manifest(const std::string& path);
// The same from the manifest's text, read from `path` (relative shard paths resolve
// against its directory).
Manifest parse_manifest(const std::string& path, std::string_view text);
// The manifest's JSON text, shard locations as given.
std::string manifest_json(const Manifest& m);
// Whether `path` names a manifest (ends in .json) rather than one token file.
bool is_manifest(const std::string& path);

// A shard's file against its manifest entry: its size, and its header's version and count
// (InputError naming the shard and what the manifest says otherwise); with `hash`, its
// SHA-256 too (read through once).
void check_shard(const ShardInfo& s, const std::string& manifest, bool hash);
// Shard s's document index read from `path` (its own, or its copy in the cache): its size,
// header and offsets (strictly increasing from 0, below the shard's count); InputError
// naming the index otherwise.
void check_index(const ShardInfo& s, const std::string& path, const std::string& manifest);
// The same for an index's bytes; errors start with `where`.
void check_index_bytes(const ShardInfo& s, const std::string& where, std::string_view bytes);
// check_shard for each local shard of `m` (remote ones are checked as they are fetched),
// once per distinct (path, size, header, hash), and with `indexes` each one's document
// index too (InputError naming the shard when it has none). Returns whether any shard is
// remote.
bool check_local_shards(const Manifest& m, bool hash, bool indexes = false);

// Where training windows may start (data.windows, docs/data.md "Document windows").
enum class Windows {
  kTokens,     // every T tokens of a shard, from its start
  kDocuments,  // at each document's start, and every T tokens after it within the document
};

// Windows of T tokens: a window at offset o of a shard is inputs tokens[o, o + T) and
// targets tokens[o + 1, o + T + 1), for each start o with o + T < count. Windows::kTokens
// starts them at o = kT, as llm.c's loader; kDocuments at d + kT for each document start d
// (from the shard's index) with d + kT before the next document's start, so every window
// begins a document or goes on with one. Windows are numbered shard after shard, in offset
// order. Token ids at or above `vocab` in a window are an InputError naming the shard and
// the offset (checked as batches are made).
class ShardCache;

class ShardedWindows : public Examples {
 public:
  // `cache`: where remote shards (those without a path) are fetched to; it must be given
  // when the manifest lists any. A remote shard is fetched when a batch first needs it (on
  // the prefetcher's thread when there is one: ahead of use), and at most about half the
  // cache's worth of remote shards stay mapped.
  // kDocuments reads every shard's index here (fetched through `cache` when remote): an
  // InputError naming the shard when it has none or it is malformed.
  ShardedWindows(Manifest m, int64_t t, int64_t vocab, std::shared_ptr<ShardCache> cache = nullptr,
                 Windows mode = Windows::kTokens);
  ~ShardedWindows() override;
  int64_t size() const override { return windows_; }
  int64_t tokens_per_example() const override { return t_; }
  Batch batch(std::span<const int64_t> windows) const override;
  Order order() const override { return Order::kFeistel; }
  const Manifest& manifest() const { return m_; }
  // Shards mapped so far (each rank maps only what it reads).
  int64_t shards_mapped() const;

 private:
  struct Mapped;
  // Shard s mapped (fetched first when remote); the caller's reference keeps it mapped.
  std::shared_ptr<const Mapped> shard(size_t s) const;
  // The path of a shard's file or its index (fetched first when remote).
  std::string local_path(const ShardInfo& s) const;
  // kDocuments: the windows of a document [start, end) of a shard of `tokens`.
  int64_t doc_windows(int64_t start, int64_t end, int64_t tokens) const;
  // Window `w` of shard `s` (counted within the shard): its first token's offset.
  int64_t window_offset(size_t s, int64_t w, const Mapped& held) const;
  Manifest m_;
  int64_t t_, vocab_, windows_ = 0;
  Windows mode_;
  std::vector<int64_t> first_window_;  // per shard, and the total last
  // kDocuments: per shard, the windows before each block of kDocBlock documents, so a
  // window's document is found by a binary search and a short scan (8 bytes per block,
  // not per window or per document).
  static constexpr int64_t kDocBlock = 64;
  std::vector<std::vector<int64_t>> doc_blocks_;
  std::shared_ptr<ShardCache> cache_;
  size_t max_remote_mapped_ = 0;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const Mapped>> mapped_;
  mutable std::vector<size_t> remote_mapped_;  // remote shards mapped, least recently used first
};

}  // namespace loom::data
