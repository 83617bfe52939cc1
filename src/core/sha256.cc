#include "loom/core/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loom/core/error.h"

namespace loom {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
  LOOM_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1);
}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::add(std::string_view p) { LOOM_CHECK(EVP_DigestUpdate(ctx_.get(), p.data(), p.size()) == 1); }

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  LOOM_CHECK(EVP_DigestFinal_ex(ctx_.get(), md, &len) == 1);
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < len; ++i) {
    s.push_back(kHex[md[i] >> 4]);
    s.push_back(kHex[md[i] & 15]);
  }
  return s;
}

std::string sha256_hex(const std::vector<std::string_view>& parts) {
  Sha256 sha;
  for (std::string_view p : parts) sha.add(p);
  return sha.hex();
}

std::string sha256_hex(std::string_view bytes) { return sha256_hex(std::vector<std::string_view>{bytes}); }

std::string sha256_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(cat(path, ": cannot open (", std::strerror(errno), ")"));
  Sha256 sha;
  std::vector<char> buf(size_t{1} << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(cat(path, ": read failed (", std::strerror(err), ")"));
    }
    if (n == 0) break;
    sha.add(std::string_view(buf.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  return sha.hex();
}

}  // namespace loom
