#include "loom/obs/metrics.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "loom/core/error.h"

namespace loom::obs {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

void JsonLine::key(const std::string& k) {
  if (body_.size() > 1) body_ += ", ";
  body_ += "\"" + k + "\": ";
}

JsonLine& JsonLine::add(const std::string& k, double v) {
  key(k);
  body_ += json_number(v);
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, const std::vector<double>& v) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < v.size(); ++i) body_ += (i > 0 ? ", " : "") + json_number(v[i]);
  body_ += "]";
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

JsonLine& JsonLine::add_json(const std::string& k, const std::string& json_text) {
  key(k);
  body_ += json_text;
  return *this;
}

JsonLine& JsonLine::add_string(const std::string& k, const std::string& v) {
  key(k);
  body_ += "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') body_ += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    body_ += c;
  }
  body_ += "\"";
  return *this;
}

MetricsFile::MetricsFile(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "a")) {
  if (f_ == nullptr) sys_check(-1, "fopen", path);
}

MetricsFile::~MetricsFile() { std::fclose(f_); }

void MetricsFile::write(const JsonLine& line) {
  std::string s = line.str() + "\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    sys_check(-1, "write", path_);
}

Progress::Progress(int64_t total_steps, int64_t every, bool quiet)
    : total_(total_steps), every_(every), tty_(::isatty(STDERR_FILENO) == 1), quiet_(quiet) {}

namespace {
std::string eta(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}
}  // namespace

void Progress::update(int64_t step, double loss, double tokens_per_s, double seconds_per_step) {
  if (quiet_) return;
  char line[160];
  std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  %.0f tok/s  eta %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss, tokens_per_s,
                eta(seconds_per_step * static_cast<double>(total_ - step)).c_str());
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line);
    live_ = true;
  } else if (step % every_ == 0 || step == total_ || step == 1) {
    std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
}

void Progress::note(const std::string& line) {
  if (quiet_) return;
  if (live_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", printable(line).c_str());
  live_ = false;
}

void Progress::finish() {
  if (live_) std::fprintf(stderr, "\n");
  live_ = false;
}

}  // namespace loom::obs
