// Little-endian encoding for Loom's own wire messages (store frames, handshakes, op
// headers). A Reader never reads past its buffer and checks every length against a cap
// before anything is allocated; a malformed message is a CommError naming `what`.
// Thread-safety: value types, no shared state.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "loom/comm/comm.h"

namespace loom::comm::wire {

class Writer {
 public:
  template <typename T>
  Writer& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(std::string_view s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  Writer& raw(std::string_view s) {
    out_.append(s);
    return *this;
  }
  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view in, std::string what) : in_(in), what_(std::move(what)) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string_view str(size_t cap) {
    auto n = get<uint32_t>();
    if (n > cap) fail(cat("a field of ", n, " bytes exceeds the cap of ", cap));
    need(n);
    auto s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view raw(size_t n) {
    need(n);
    auto s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  void finish() const {
    if (pos_ != in_.size()) fail(cat(in_.size() - pos_, " unexpected trailing bytes"));
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw CommError(cat("malformed ", what_, ": ", why), -1);
  }

 private:
  void need(size_t n) const {
    if (in_.size() - pos_ < n) fail(cat("truncated (", n, " more bytes expected at offset ", pos_, ")"));
  }
  std::string_view in_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace loom::comm::wire
