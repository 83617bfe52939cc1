#include "loom/core/error.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom {

long sys_check(long rc, const char* call, const std::string& subject) {
  if (rc < 0) {
    int err = errno;
    throw RuntimeError(cat(call, "(", subject, ") failed: ", std::strerror(err)));
  }
  return rc;
}

namespace {
// The length of the UTF-8 sequence starting at s[i] (2 to 4 bytes, no overlong forms, no
// surrogates), or 0 when it is not one.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  const size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && b(1) < 0xa0) || (c == 0xed && b(1) > 0x9f) || (c == 0xf0 && b(1) < 0x90) || (c == 0xf4 && b(1) > 0x8f))
    return 0;
  return n;
}
}  // namespace

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

std::string printable(std::string_view text) { return printable(text, Lines::kEscape); }

std::string printable(std::string_view text, Lines lines) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c >= 0x20 && c < 0x7f) || (lines == Lines::kKeep && (c == '\n' || c == '\t'))) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // U+0080..U+009F (C2 80..C2 9F) are C1 controls: CSI among them drives terminals.
    if (const size_t n = utf8_sequence(text, i); n > 0 && !(c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0)) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    ++i;
  }
  return out;
}

void check_failed(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "loom: internal error at %s:%d: %s failed\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

void check_flag_range(const std::string& flag, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) throw InputError(cat(flag, " = ", v, ": expected an integer in [", lo, ", ", hi, "]"));
}

void check_flag_range(const std::string& flag, const std::vector<int64_t>& values, int64_t lo, int64_t hi) {
  if (values.empty()) throw InputError(cat(flag, ": expected at least one value"));
  for (int64_t v : values) check_flag_range(flag, v, lo, hi);
}

}  // namespace loom
