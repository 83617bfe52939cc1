// Remote shards through a local cache (include/loom/data/shard_cache.h, docs/data.md).
#include "loom/data/shard_cache.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/dl_library.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/log.h"
#include "loom/core/sha256.h"

namespace loom::data {
namespace fs = std::filesystem;

std::string redact_url(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t host = scheme + 3, slash = url.find('/', host), at = url.rfind('@', slash);
  if (at == std::string::npos || at < host) return url;
  return url.substr(0, host) + "***" + url.substr(at);
}

namespace {

// An open file descriptor, closed when it goes.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The shard's lock (flock on NAME.lock): one download per shard per host.
class ShardLock {
 public:
  explicit ShardLock(const std::string& path) {
    fd_.fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_.fd < 0) throw RuntimeError(cat(path, ": cannot open the shard's lock file (", std::strerror(errno), ")"));
    while (::flock(fd_.fd, LOCK_EX) != 0)
      if (errno != EINTR) throw RuntimeError(cat(path, ": flock failed (", std::strerror(errno), ")"));
  }

 private:
  Fd fd_;  // closing it releases the lock
};

void touch(const std::string& path) { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

int64_t size_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// libcurl, opened on the first remote shard (dlopen) rather than linked: linked, it and the
// 30 libraries it loads (TLS, Kerberos, LDAP, SSH, ...) cost every loom process about 12 ms
// of its 31 ms start, `loom --help` included, measured; opened here they cost only the
// processes that download.
struct Curl {
  decltype(&curl_global_init) global_init = nullptr;
  decltype(&curl_easy_init) easy_init = nullptr;
  decltype(&curl_easy_cleanup) easy_cleanup = nullptr;
  decltype(&curl_easy_setopt) easy_setopt = nullptr;
  decltype(&curl_easy_getinfo) easy_getinfo = nullptr;
  decltype(&curl_easy_perform) easy_perform = nullptr;
  decltype(&curl_easy_strerror) easy_strerror = nullptr;
};

Curl open_curl() {
  const std::string soname = "libcurl.so.4";  // the ABI curl/curl.h describes since 7.16
  std::string reason;
  const std::optional<DlLibrary> lib = DlLibrary::open("libcurl", {soname}, &reason);
  if (!lib)
    throw RuntimeError(cat("remote shards need libcurl, which did not open as ", soname, ": ", reason,
                           " (Debian: apt-get install libcurl4)"));
  Curl c;
  lib->resolve("curl_global_init", c.global_init);
  lib->resolve("curl_easy_init", c.easy_init);
  lib->resolve("curl_easy_cleanup", c.easy_cleanup);
  lib->resolve("curl_easy_setopt", c.easy_setopt);
  lib->resolve("curl_easy_getinfo", c.easy_getinfo);
  lib->resolve("curl_easy_perform", c.easy_perform);
  lib->resolve("curl_easy_strerror", c.easy_strerror);
  if (c.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw RuntimeError("curl_global_init failed");
  return c;  // the library stays open for the process's life
}

// The library, opened and initialized once (thread-safe: a function-local static).
const Curl& curl_lib() {
  static const Curl c = open_curl();
  return c;
}

// One transfer: appends to `fd` from byte `offset` (a range request when > 0).
struct Transfer {
  int fd;
  int64_t offset;
  CURL* curl;
  bool checked = false;  // whether the first write has looked at the status
  int write_errno = 0;
};

size_t write_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  if (!t->checked) {
    t->checked = true;
    long status = 0;
    curl_lib().easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
    if (t->offset > 0 && status == 200) {  // the server ignored the range: start the file again
      if (::ftruncate(t->fd, 0) != 0 || ::lseek(t->fd, 0, SEEK_SET) != 0) {
        t->write_errno = errno;
        return 0;
      }
    }
  }
  const size_t bytes = size * n;
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = ::write(t->fd, data + done, bytes - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      t->write_errno = errno;
      return 0;  // curl reports CURLE_WRITE_ERROR
    }
    done += static_cast<size_t>(w);
  }
  return bytes;
}

}  // namespace

ShardCache::ShardCache(CacheOptions options) : o_(std::move(options)) {
  curl_lib();
  std::error_code ec;
  fs::create_directories(o_.dir, ec);
  if (ec || !fs::is_directory(o_.dir, ec))
    throw InputError(cat("data.cache_dir = \"", printable(o_.dir), "\": cannot create the shard cache (", ec.message(), ")"));
}

int64_t ShardCache::bytes() const {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o_.dir, ec))
    if (e.path().extension() == ".bin") total += size_of(e.path().string());
  return total;
}

void ShardCache::make_room(int64_t need, const std::string& keep) {
  struct Entry {
    std::string path;
    int64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<Entry> files;
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o_.dir, ec)) {
    if (e.path().extension() != ".bin" || e.path().filename() == keep) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0) continue;
    files.push_back({e.path().string(), static_cast<int64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec});
    total += static_cast<int64_t>(st.st_size);
  }
  std::sort(files.begin(), files.end(), [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
  for (const Entry& f : files) {
    if (total + need <= o_.max_bytes) break;
    // A rank reading it keeps its mapping; the space returns when it lets go. Its empty lock
    // file stays: removing it could give two processes waiting for it two different locks.
    if (::unlink(f.path.c_str()) == 0) total -= f.bytes;
  }
}

void ShardCache::download(const ShardInfo& s, const std::string& part, const std::string& where) {
  std::string last = "no attempt";
  double pause = o_.first_backoff_s;
  for (int attempt = 0; attempt <= o_.retries; ++attempt) {
    if (attempt > 0) {
      log_warn(cat(where, ": attempt ", attempt, " failed (", last, "); trying again in ", pause, " s"));
      std::this_thread::sleep_for(std::chrono::duration<double>(pause));
      pause *= 2;
    }
    Fd fd;
    fd.fd = ::open(part.c_str(), O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0644);
    if (fd.fd < 0) throw RuntimeError(cat(part, ": cannot write the download (", std::strerror(errno), ")"));
    int64_t offset = size_of(part);
    if (offset > s.bytes()) {  // not this shard's beginning: start again
      if (::ftruncate(fd.fd, 0) != 0) throw RuntimeError(cat(part, ": ftruncate failed (", std::strerror(errno), ")"));
      offset = 0;
    }
    if (offset == s.bytes()) return;
    const Curl& lib = curl_lib();
    std::unique_ptr<CURL, void (*)(CURL*)> curl(lib.easy_init(), lib.easy_cleanup);
    if (!curl) throw RuntimeError("curl_easy_init failed");
    Transfer t{.fd = fd.fd, .offset = offset, .curl = curl.get()};
    char error[CURL_ERROR_SIZE] = {};
    lib.easy_setopt(curl.get(), CURLOPT_URL, s.location.c_str());
    lib.easy_setopt(curl.get(), CURLOPT_PROTOCOLS_STR, "http,https");
    lib.easy_setopt(curl.get(), CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    lib.easy_setopt(curl.get(), CURLOPT_FOLLOWLOCATION, 1L);
    lib.easy_setopt(curl.get(), CURLOPT_MAXREDIRS, 5L);
    lib.easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);
    lib.easy_setopt(curl.get(), CURLOPT_FAILONERROR, 1L);
    lib.easy_setopt(curl.get(), CURLOPT_CONNECTTIMEOUT, 10L);
    lib.easy_setopt(curl.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
    lib.easy_setopt(curl.get(), CURLOPT_LOW_SPEED_TIME, static_cast<long>(std::max(1.0, o_.stall_s)));
    lib.easy_setopt(curl.get(), CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(offset));
    lib.easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, write_body);
    lib.easy_setopt(curl.get(), CURLOPT_WRITEDATA, &t);
    lib.easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, error);
    const CURLcode rc = lib.easy_perform(curl.get());
    long status = 0;
    lib.easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &status);
    const int64_t have = size_of(part);
    if (rc == CURLE_OK && have == s.bytes()) return;
    if (t.write_errno == ENOSPC || t.write_errno == EDQUOT)
      throw InputError(cat("the shard cache ", o_.dir, " is full (", std::strerror(t.write_errno), ") while writing ", where,
                           ": free space there, or set data.cache_dir (loom data fetch: --cache-dir) elsewhere"));
    if (t.write_errno != 0) throw RuntimeError(cat(part, ": writing the download failed (", std::strerror(t.write_errno), ")"));
    if (rc == CURLE_OK && have > s.bytes())
      throw InputError(cat(where, ": the server sent ", have, " bytes, but the manifest says ", s.bytes()));
    if (rc == CURLE_HTTP_RETURNED_ERROR && status == 416) {  // the range starts past the server's file
      if (::ftruncate(fd.fd, 0) != 0) throw RuntimeError(cat(part, ": ftruncate failed (", std::strerror(errno), ")"));
      last = "HTTP 416 for the rest of a partial download";
      continue;
    }
    if (rc == CURLE_HTTP_RETURNED_ERROR && status >= 400 && status < 500 && status != 408 && status != 429)
      throw RuntimeError(cat(where, ": HTTP ", status, " (the server does not give it)"));
    // A broken transfer: the bytes so far stay for the next attempt's range request.
    last = rc == CURLE_OK ? cat("the transfer ended at ", have, " of ", s.bytes(), " bytes")
                          : cat(lib.easy_strerror(rc), error[0] != '\0' ? cat(": ", redact_url(error)) : std::string(),
                                status > 0 ? cat(", HTTP ", status) : std::string(), ", ", have, " of ", s.bytes(), " bytes");
  }
  throw RuntimeError(cat(where, ": could not download it in ", o_.retries + 1, " attempts (last: ", last, ")"));
}

std::string ShardCache::fetch(const ShardInfo& s, const std::string& manifest) {
  const std::string name = s.sha256 + ".bin";
  const std::string path = (fs::path(o_.dir) / name).string();
  const std::string where = cat("shard ", redact_url(s.location), " (", manifest, ")");
  // A file named by its hash was verified before it got the name.
  if (size_of(path) == s.bytes()) {
    touch(path);
    return path;
  }
  if (s.bytes() > o_.max_bytes)
    throw InputError(cat(where, ": ", s.bytes(), " bytes, more than the whole cache (data.cache_mb)"));
  const ShardLock lock((fs::path(o_.dir) / (s.sha256 + ".lock")).string());
  if (size_of(path) == s.bytes()) {  // another process fetched it while this one waited
    touch(path);
    return path;
  }
  make_room(s.bytes(), name);
  const std::string part = path + ".part";
  // The disk must hold what is left to download (a full disk is named now, not mid-transfer).
  struct statvfs fsinfo {};
  if (::statvfs(o_.dir.c_str(), &fsinfo) == 0) {
    const auto free_bytes = static_cast<int64_t>(fsinfo.f_bavail) * static_cast<int64_t>(fsinfo.f_frsize);
    const int64_t needed = s.bytes() - std::max<int64_t>(0, size_of(part));
    if (free_bytes < needed)
      throw InputError(cat("the shard cache ", o_.dir, " has ", free_bytes, " bytes free, but ", where, " needs ", needed,
                           " more: free space there, or set data.cache_dir (loom data fetch: --cache-dir) elsewhere"));
  }
  download(s, part, where);
  const std::string got = sha256_file(part);
  if (got != s.sha256) {
    ::unlink(part.c_str());
    throw InputError(cat(where, ": SHA-256 ", got, ", but the manifest says ", s.sha256,
                         ": the server's shard is not the one listed; nothing of it is kept"));
  }
  if (::rename(part.c_str(), path.c_str()) != 0)
    throw RuntimeError(cat("rename(", part, ", ", path, ") failed: ", std::strerror(errno)));
  fsync_dir(o_.dir);
  touch(path);
  return path;
}

}  // namespace loom::data
