#include "loom/obs/trace.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "loom/core/error.h"

namespace loom::obs {

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string micros(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", std::chrono::duration<double, std::micro>(d).count());
  return buf;
}

}  // namespace

void Trace::span(Track track, const std::string& name, Clock::time_point begin, Clock::time_point end,
                 const std::vector<std::pair<std::string, std::string>>& args) {
  std::string e = "\"name\": " + quoted(name) + ", \"ph\": \"X\", \"tid\": " + std::to_string(track) +
                  ", \"ts\": " + micros(begin - origin_) + ", \"dur\": " + micros(std::max(end - begin, Clock::duration{}));
  if (!args.empty()) {
    e += ", \"args\": {";
    for (size_t i = 0; i < args.size(); ++i) e += (i ? ", " : "") + quoted(args[i].first) + ": " + args[i].second;
    e += "}";
  }
  events_.push_back(std::move(e));
}

std::string Trace::events(int rank) const {
  const std::string pid = std::to_string(rank);
  std::string out = "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + pid + ", \"args\": {\"name\": \"rank " +
                    pid + "\"}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + pid +
                    ", \"args\": {\"sort_index\": " + pid + "}}";
  for (const auto& [tid, name] : {std::pair{kTraining, "training"}, std::pair{kComm, "communication"}})
    out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid + ", \"tid\": " + std::to_string(tid) +
           ", \"args\": {\"name\": \"" + name + "\"}}";
  for (const std::string& e : events_) out += ",\n{\"pid\": " + pid + ", " + e + "}";
  return out;
}

std::string merge_traces(const std::vector<std::string>& per_rank_events) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t r = 0; r < per_rank_events.size(); ++r) out += (r ? ",\n" : "") + per_rank_events[r];
  return out + "\n]}\n";
}

std::vector<int64_t> parse_steps(const std::string& spec) {
  const std::string expected = "expected steps such as \"3\", \"3,7\" or \"2-4\" (1-based, ascending ranges)";
  std::vector<int64_t> steps;
  auto number = [&](const std::string& s) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || v < 1) throw InputError(cat("\"", spec, "\": ", expected));
    return v;
  };
  size_t pos = 0;
  while (pos <= spec.size() && !spec.empty()) {
    size_t comma = spec.find(',', pos);
    const std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t dash = item.find('-');
    const int64_t lo = number(item.substr(0, dash)), hi = dash == std::string::npos ? lo : number(item.substr(dash + 1));
    if (hi < lo || hi - lo > 1000000) throw InputError(cat("\"", spec, "\": ", expected));
    for (int64_t s = lo; s <= hi; ++s) steps.push_back(s);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

}  // namespace loom::obs
