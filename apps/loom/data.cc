// `loom data prepare` and `loom tokenizer train|encode|decode` (docs/data.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <optional>

#include "commands.h"
#include "config_train.h"
#include "loom/checkpoint/outputs.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/data/data.h"
#include "loom/data/dataset.h"
#include "loom/data/shard_cache.h"
#include "loom/data/tokenizer.h"

namespace loom::app {
namespace fs = std::filesystem;

namespace {

// The paths that "text:PATH" sources read.
std::vector<std::string> source_paths(const std::vector<std::string>& sources) {
  std::vector<std::string> paths;
  for (const std::string& s : sources) paths.push_back(s.starts_with("text:") ? s.substr(5) : s);
  return paths;
}

// FILE's bytes, or standard input's for "-".
std::string read_input(const std::string& file) {
  if (file != "-") return read_file(file);
  return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
}

void write_stdout(std::string_view bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
    throw RuntimeError("writing to standard output failed");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int train(const TokenizerArgs& a) {
  check_flag_range("--vocab-size", a.vocab_size, 257, int64_t{1} << 24);
  check_flag_range("--min-frequency", a.min_frequency, 1, int64_t{1} << 40);
  for (const char* f : {"encoder.json", "vocab.bpe"}) {
    const fs::path p = fs::path(a.out) / f;
    checkpoint::check_output_file("--out", p.string(), source_paths(a.sources));
    if (std::error_code ec; fs::exists(p, ec))
      throw InputError(cat("--out ", printable(a.out), " already holds a tokenizer (", f,
                           "); choose another directory or remove it first"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> texts;
  for (data::TextFile& f : data::read_text_sources(a.sources)) texts.push_back(std::move(f.text));
  if (texts.empty()) throw InputError("tokenizer train: the sources hold no text");
  const data::TrainBpeResult r = data::train_bpe(texts, {.vocab_size = a.vocab_size, .min_frequency = a.min_frequency});
  r.tokenizer.save(a.out);
  std::printf("trained %lld merges on %zu files (%.1f MB, %lld pieces, %lld distinct) in %.1f s: %s (vocabulary %lld, "
              "<|endoftext|> = %d)\n",
              static_cast<long long>(r.merges), texts.size(), static_cast<double>(r.bytes) / 1e6,
              static_cast<long long>(r.pieces), static_cast<long long>(r.distinct_pieces), seconds_since(t0),
              printable(a.out).c_str(), static_cast<long long>(r.tokenizer.vocab_size()), r.tokenizer.end_of_text());
  return 0;
}

int encode(const TokenizerArgs& a) {
  check_flag_range("--repeat", a.repeat, 1, 1000);
  data::Tokenizer t = data::Tokenizer::load(a.tokenizer);
  const std::string text = read_input(a.file);
  std::vector<int32_t> ids;
  double best = 0;
  for (int64_t r = 0; r < a.repeat; ++r) {
    ids.clear();
    data::Tokenizer fresh = t;  // each repeat starts with an empty piece cache
    const auto t0 = std::chrono::steady_clock::now();
    fresh.encode(text, ids);
    const double s = seconds_since(t0);
    best = r == 0 ? s : std::min(best, s);
  }
  if (a.stats) {
    std::fprintf(stderr, "{\"bytes\": %zu, \"ids\": %zu, \"seconds\": %.6f, \"mb_per_s\": %.3f}\n", text.size(),
                 ids.size(), best, best > 0 ? static_cast<double>(text.size()) / best / 1e6 : 0.0);
    return 0;
  }
  std::string out;
  out.reserve(ids.size() * 6);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out.push_back(' ');
    out += std::to_string(ids[i]);
  }
  out.push_back('\n');
  write_stdout(out);
  return 0;
}

int decode(const TokenizerArgs& a) {
  data::Tokenizer t = data::Tokenizer::load(a.tokenizer);
  const std::string text = read_input(a.file);
  const std::string where = a.file == "-" ? "standard input" : a.file;
  std::vector<int32_t> ids;
  for (size_t at = 0, n = 1; at < text.size(); ++n) {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
    if (at == text.size()) break;
    size_t end = at;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    const std::string word = text.substr(at, end - at);
    char* stop = nullptr;
    const long long id = std::strtoll(word.c_str(), &stop, 10);
    if (stop != word.c_str() + word.size() || word.size() > 12 || id < 0 || id >= t.vocab_size())
      throw InputError(cat(where, ": id ", n, " is \"", printable(word.substr(0, 40)), "\", expected an integer 0 to ",
                           t.vocab_size() - 1, " (the vocabulary of ", t.spec(), ")"));
    ids.push_back(static_cast<int32_t>(id));
    at = end;
  }
  write_stdout(t.decode(ids));
  return 0;
}

}  // namespace

int run_tokenizer(const TokenizerArgs& a) {
  if (a.action == "train") return train(a);
  if (a.action == "encode") return encode(a);
  return decode(a);
}

int run_data_fetch(const DataFetchArgs& a) {
  if (!(a.cache_mb > 0 && a.cache_mb <= 1e9)) throw InputError(cat("--cache-mb ", a.cache_mb, ": expected MiB in (0, 1e9]"));
  check_flag_range("--retries", a.retries, 0, 100);
  const auto t0 = std::chrono::steady_clock::now();
  const data::Manifest m = data::read_manifest(a.manifest);
  // A dataset whose shards all have document indexes (as prepare writes) has them checked
  // and fetched too, so document windows can start from the cache alone.
  const bool indexed = std::all_of(m.shards.begin(), m.shards.end(), [](const data::ShardInfo& s) { return s.documents >= 0; });
  data::check_local_shards(m, /*hash=*/true, indexed);
  std::optional<data::ShardCache> cache;
  int64_t fetched = 0, bytes = 0;
  for (const data::ShardInfo& s : m.shards) {
    if (!s.path.empty()) continue;
    if (!cache)
      cache.emplace(data::CacheOptions{.dir = a.cache_dir.empty() ? default_cache_dir() : a.cache_dir,
                                       .max_bytes = static_cast<int64_t>(a.cache_mb * 1024 * 1024),
                                       .retries = static_cast<int>(a.retries)});
    cache->fetch(s, a.manifest);
    ++fetched;
    bytes += s.bytes();
    if (indexed) {
      data::check_index(s, cache->fetch(s.index(), a.manifest), a.manifest);
      bytes += s.index().bytes();
    }
  }
  std::printf("%s: %zu shards, %lld tokens, checked", printable(a.manifest).c_str(), m.shards.size(),
              static_cast<long long>(m.tokens));
  if (cache)
    std::printf("; %lld remote shards (%.1f MB) in the cache %s (%.1f MB now) in %.1f s", static_cast<long long>(fetched),
                static_cast<double>(bytes) / 1e6, printable(cache->options().dir).c_str(),
                static_cast<double>(cache->bytes()) / 1e6, seconds_since(t0));
  std::printf("\n");
  return 0;
}

int run_data_prepare(const DataPrepareArgs& a) {
  const std::vector<std::string> inputs = source_paths(a.sources);
  const bool sharded = a.sharded || a.out.ends_with('/') || fs::is_directory(a.out);
  if (!sharded) {
    checkpoint::check_output_file("--out", a.out, inputs);
    checkpoint::check_output_file("--out (its validation file)", data::val_path_for(a.out), inputs);
  } else {  // a directory of shards: its manifests are checked as files (prepare refuses existing ones)
    checkpoint::check_output_file("--out", (fs::path(a.out) / "train.json").string(), inputs);
  }
  check_flag_range("--shard-tokens", a.shard_tokens, 1, INT32_MAX);
  check_flag_range("--threads", a.threads, 0, 1024);
  const data::PrepareResult r =
      data::prepare_text({.sources = a.sources, .out = a.out, .val_fraction = a.val_fraction, .sharded = sharded,
                          .shard_tokens = a.shard_tokens,
                          .threads = static_cast<int>(a.threads), .progress = true},
                         data::Tokenizer::load(a.tokenizer));
  auto split = [](const std::string& path, int64_t tokens, int64_t shards) {
    if (path.empty()) return std::string("no validation tokens");
    return cat(printable(path), " (", tokens, " tokens", shards > 0 ? cat(" in ", shards, " shards") : std::string(), ")");
  };
  std::printf("prepared %lld files (%.1f MB) with tokenizer %s in %.1f s (%.1f MB/s): %s, %s\n",
              static_cast<long long>(r.files), static_cast<double>(r.bytes) / 1e6, printable(a.tokenizer).c_str(),
              r.seconds, static_cast<double>(r.bytes) / 1e6 / std::max(r.seconds, 1e-9),
              split(r.train_path, r.train_tokens, r.train_shards).c_str(), split(r.val_path, r.val_tokens, r.val_shards).c_str());
  return 0;
}

}  // namespace loom::app
