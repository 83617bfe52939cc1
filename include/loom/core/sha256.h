// SHA-256 (OpenSSL's EVP), for checkpoints, dataset shards and the shard cache: in parts,
// whole, or of a file read through in blocks.
// Thread-safety: a Sha256 is used by one thread; the functions are reentrant.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct evp_md_ctx_st;

namespace loom {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void add(std::string_view bytes);
  // 64 lowercase hex digits; ends the hash.
  std::string hex();

 private:
  std::unique_ptr<evp_md_ctx_st, void (*)(evp_md_ctx_st*)> ctx_;
};

std::string sha256_hex(std::string_view bytes);
std::string sha256_hex(const std::vector<std::string_view>& parts);
// The SHA-256 of a file's bytes, read in blocks (InputError naming the file when it cannot
// be read).
std::string sha256_file(const std::string& path);

}  // namespace loom
