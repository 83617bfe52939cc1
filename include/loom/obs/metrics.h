// Observability for training: metrics.jsonl lines and the live progress line.
//
// metrics.jsonl (docs/formats.md): one JSON object per optimizer step, keys in a fixed
// order; floating-point numbers printed in their shortest round-trip form, so two equal
// lines mean bitwise equal values.
// Thread-safety: a JsonLine or Progress is used by one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace loom::obs {

// Shortest decimal that parses back to exactly `v` ("null" for NaN or infinity, which
// JSON cannot hold).
std::string json_number(double v);

// Builds one JSON object, keys in insertion order.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, double v);
  JsonLine& add(const std::string& key, int64_t v);
  JsonLine& add(const std::string& key, const std::vector<double>& v);  // a JSON array
  JsonLine& add_string(const std::string& key, const std::string& v);
  JsonLine& add_json(const std::string& key, const std::string& json_text);  // a value already JSON
  std::string str() const { return body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_ = "{";
};

// Appends lines to a file, flushing each (a crash loses at most the line being written).
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  void write(const JsonLine& line);

 private:
  std::string path_;
  std::FILE* f_;
};

// One live line on a terminal (rewritten in place), plain lines every `every` steps
// otherwise. Writes to stderr.
class Progress {
 public:
  Progress(int64_t total_steps, int64_t every, bool quiet);
  void update(int64_t step, double loss, double tokens_per_s, double seconds_per_step);
  void note(const std::string& line);  // a line that must not be overwritten
  void finish();

 private:
  int64_t total_, every_;
  bool tty_, quiet_, live_ = false;
};

}  // namespace loom::obs
