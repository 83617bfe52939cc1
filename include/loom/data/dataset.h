// Sharded token datasets (docs/data.md, "Datasets"): a manifest (JSON) names token shards,
// each an llm.c token file (uint16 ids, version 1, or uint32, version 2) with its token
// count and SHA-256, any number of them, 64-bit counts in all. Training draws windows of T
// tokens from every shard through a seeded permutation of all windows that no world size
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
  int64_t bytes() const { return 1024 + tokens * dtype_bytes; }
};

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
// check_shard for each local shard of `m` (remote ones are checked as they are fetched),
// once per distinct (path, size, header, hash). Returns whether any shard is remote.
bool check_local_shards(const Manifest& m, bool hash);

// Windows of T tokens: window w of shard s is inputs tokens[kT, kT + T) and targets
// tokens[kT + 1, kT + T + 1) for each k with kT + T < count, as llm.c's loader; windows are
// numbered shard after shard. Token ids at or above `vocab` in a window are an InputError
// naming the shard and the offset (checked as batches are made).
class ShardCache;

class ShardedWindows : public Examples {
 public:
  // `cache`: where remote shards (those without a path) are fetched to; it must be given
  // when the manifest lists any. A remote shard is fetched when a batch first needs it (on
  // the prefetcher's thread when there is one: ahead of use), and at most about half the
  // cache's worth of remote shards stay mapped.
  ShardedWindows(Manifest m, int64_t t, int64_t vocab, std::shared_ptr<ShardCache> cache = nullptr);
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
  Manifest m_;
  int64_t t_, vocab_, windows_ = 0;
  std::vector<int64_t> first_window_;  // per shard, and the total last
  std::shared_ptr<ShardCache> cache_;
  size_t max_remote_mapped_ = 0;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const Mapped>> mapped_;
  mutable std::vector<size_t> remote_mapped_;  // remote shards mapped, least recently used first
};

}  // namespace loom::data
