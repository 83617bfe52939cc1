// Remote shards through a local cache (docs/data.md, "Remote shards"): a manifest's http(s)
// shards are downloaded with libcurl into a cache directory, each under its SHA-256 (so a
// shard listed by several manifests is one file), verified before anyone reads it, resumed
// with a range request after a broken transfer, retried with exponential backoff, and
// downloaded once per host however many local ranks want it (a lock file per shard). The
// directory stays within its size bound by removing the least recently used shards (a
// rank still reading a removed shard keeps its mapping; the disk space returns when it
// lets go). A URL's user and password are never printed.
// Thread-safety: fetch() may be called from any thread and process at once.
#pragma once

#include <cstdint>
#include <string>

#include "loom/data/dataset.h"

namespace loom::data {

struct CacheOptions {
  std::string dir;             // created if absent (apps/loom picks the default: docs/data.md)
  int64_t max_bytes = int64_t{10} << 30;
  int retries = 5;             // attempts after the first, each after a doubled pause
  double first_backoff_s = 0.5;
  double stall_s = 30;         // a transfer slower than 1 byte/s for this long is broken
};

// `url` with any user and password replaced by "***".
std::string redact_url(const std::string& url);

class ShardCache {
 public:
  explicit ShardCache(CacheOptions options);
  // The local path of shard `s` (s.location an http or https URL), downloading and
  // verifying it first when the cache does not hold it, and marking it used. RuntimeError
  // naming the shard and URL when the server cannot give it after every retry;
  // InputError when what it gives disagrees with the manifest (size or SHA-256: nothing is
  // kept). `manifest` names the manifest in errors.
  std::string fetch(const ShardInfo& s, const std::string& manifest);
  // Bytes of complete shards in the directory now.
  int64_t bytes() const;
  const CacheOptions& options() const { return o_; }

 private:
  void download(const ShardInfo& s, const std::string& part, const std::string& where);
  void make_room(int64_t need, const std::string& keep);
  CacheOptions o_;
};

}  // namespace loom::data
