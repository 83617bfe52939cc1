// Loom's two error channels (STYLE.md rule 10).
//
// LOOM_CHECK*: broken invariants, i.e. programming errors. They print file:line and the
// values compared, then abort. Never used for anything a user or the environment can cause.
//
// InputError / RuntimeError: environment failures (bad config, unreadable or corrupt file,
// dead peer). Thrown anywhere, caught only at the CLI edge, printed as one line.
// InputError exits 2 (bad input), RuntimeError exits 1 (runtime failure).
//
// Thread-safety: all of it is safe to use from any thread.
#pragma once

#include <cstdint>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  virtual int exit_code() const = 0;
};

// Bad input: a file, key or value the user gave that is not what was expected.
class InputError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

// The environment failed at run time (I/O error, dead peer, timeout).
class RuntimeError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 1; }
};

// Builds a message from any streamable values: cat("key ", k, " expected ", v).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// `text` safe to print as part of one line: control characters (newline, escape, C1
// controls) and bytes that are not UTF-8 become \n, \t, \r or \xHH, so that a name or
// value echoed from input can neither break a message into several lines nor drive the
// terminal. Every error and log line passes through it when printed.
std::string printable(std::string_view text);
// The same for text of several lines (sampled text, a model's output): newlines and tabs
// kept as they are with Lines::kKeep, everything else as printable(text) escapes it.
enum class Lines : uint8_t { kEscape, kKeep };
std::string printable(std::string_view text, Lines lines);

// The message of the exception `error` holds ("unknown error" for one that is not a
// std::exception). REQUIRES: error not null.
std::string what_of(const std::exception_ptr& error);

// Throws RuntimeError naming the failed system call, its subject and errno's text when
// rc < 0. Returns rc otherwise. Every OS call goes through this or an equivalent.
long sys_check(long rc, const char* call, const std::string& subject);

[[noreturn]] void check_failed(const char* file, int line, const std::string& what);

// InputError "FLAG = V: expected an integer in [LO, HI]" unless lo <= v <= hi: every count a
// command takes from its flags is bounded before anything is sized by it (docs/security.md).
void check_flag_range(const std::string& flag, int64_t v, int64_t lo, int64_t hi);
// The same for each of `values`, and at least one of them.
void check_flag_range(const std::string& flag, const std::vector<int64_t>& values, int64_t lo, int64_t hi);

}  // namespace loom

#define LOOM_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) ::loom::check_failed(__FILE__, __LINE__, "check " #cond); \
  } while (0)

#define LOOM_CHECK_OP(a, op, b)                                                          \
  do {                                                                                   \
    const auto& loom_a_ = (a);                                                           \
    const auto& loom_b_ = (b);                                                           \
    if (!(loom_a_ op loom_b_))                                                           \
      ::loom::check_failed(__FILE__, __LINE__,                                           \
                           ::loom::cat("check " #a " " #op " " #b " (", loom_a_, " vs ", \
                                       loom_b_, ")"));                                   \
  } while (0)

#define LOOM_CHECK_EQ(a, b) LOOM_CHECK_OP(a, ==, b)
#define LOOM_CHECK_LE(a, b) LOOM_CHECK_OP(a, <=, b)
#define LOOM_CHECK_LT(a, b) LOOM_CHECK_OP(a, <, b)
