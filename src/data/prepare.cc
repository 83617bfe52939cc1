// `loom data prepare`: text in (files, directories, globs, JSONL), token files out: one
// llm.c file and its validation file, or a directory of shards with a manifest for each
// split (docs/data.md). Documents are encoded on several threads and written in order.
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/host.h"
#include "loom/core/sha256.h"
#include "loom/data/data.h"
#include "loom/data/dataset.h"
#include "loom/data/tokenizer.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

bool looks_binary(std::string_view bytes) {
  return std::memchr(bytes.data(), '\0', std::min<size_t>(bytes.size(), 4096)) != nullptr;
}

bool has_glob(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

// One input file of a source: text (the whole file is a document) or JSONL (each line's
// `field` is one).
struct Input {
  fs::path path;
  bool jsonl = false;
  std::string field;
};

// The files a source names, in a stable order: "text:PATH" (a file, a directory's regular
// files, or a glob) or "jsonl:PATH[:FIELD]" (FIELD "text" by default).
std::vector<Input> inputs_of(const std::string& source) {
  const bool jsonl = source.starts_with("jsonl:");
  if (!jsonl && !source.starts_with("text:"))
    throw InputError(cat("data source \"", printable(source), "\": expected text:PATH or jsonl:PATH[:FIELD]"));
  std::string spec = source.substr(jsonl ? 6 : 5), field = "text";
  if (jsonl) {
    if (const size_t colon = spec.rfind(':'); colon != std::string::npos && !fs::exists(spec)) {
      field = spec.substr(colon + 1);
      spec = spec.substr(0, colon);
    }
    if (field.empty()) throw InputError(cat("data source \"", printable(source), "\": empty FIELD"));
  }
  std::vector<fs::path> files;
  if (has_glob(spec)) {
    glob_t g{};
    const int rc = ::glob(spec.c_str(), GLOB_NOSORT, nullptr, &g);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i)
      if (std::error_code ec; fs::is_regular_file(g.gl_pathv[i], ec)) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (files.empty()) throw InputError(cat(printable(spec), ": the pattern matches no file (", printable(source), ")"));
  } else {
    const fs::path p(spec);
    std::error_code ec;
    if (!fs::exists(p, ec)) throw InputError(cat(printable(p.string()), ": no such file or directory (", printable(source), ")"));
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<Input> out;
  for (fs::path& f : files) out.push_back({std::move(f), jsonl, field});
  return out;
}

std::vector<Input> all_inputs(const std::vector<std::string>& sources) {
  if (sources.empty()) throw InputError("expected at least one text:PATH or jsonl:PATH source");
  std::vector<Input> out;
  std::set<fs::path> seen;
  for (const std::string& source : sources)
    for (Input& in : inputs_of(source))
      if (seen.insert(fs::canonical(in.path)).second) out.push_back(std::move(in));  // e.g. cookie.u8 -> cookie
  return out;
}

// A piece of work: one text file, or a run of a JSONL file's lines.
struct Work {
  std::string text;  // the file's bytes, or the lines (each ending in '\n')
  const Input* input = nullptr;
  int64_t first_line = 0;  // JSONL: the line number of the first
  int64_t first_document = 0;
};

// Reads the inputs in order, a text file or about `chunk` bytes of JSONL lines at a time.
class Reader {
 public:
  Reader(const std::vector<Input>& inputs, size_t chunk) : inputs_(inputs), chunk_(chunk) {}
  bool next(Work& w) {
    while (at_ < inputs_.size()) {
      const Input& in = inputs_[at_];
      if (!in.jsonl) {
        ++at_;
        w = Work{.text = read_file(in.path.string()), .input = &in, .first_document = documents_};
        if (looks_binary(w.text)) continue;  // a binary file among text files is skipped
        ++files_;
        ++documents_;
        return true;
      }
      if (!stream_.is_open()) {
        stream_.open(in.path, std::ios::binary);
        if (!stream_) throw InputError(cat(printable(in.path.string()), ": cannot open"));
        line_ = 0;
        ++files_;
      }
      w = Work{.input = &in, .first_line = line_ + 1, .first_document = documents_};
      for (std::string line; w.text.size() < chunk_ && std::getline(stream_, line);) {
        ++line_;
        w.text += line;
        w.text += '\n';
        ++documents_;
      }
      if (stream_.eof() || w.text.size() < chunk_) {
        stream_.close();
        stream_.clear();
        ++at_;
      }
      if (!w.text.empty()) return true;
    }
    return false;
  }
  int64_t files() const { return files_; }

 private:
  const std::vector<Input>& inputs_;
  size_t chunk_, at_ = 0;
  std::ifstream stream_;
  int64_t line_ = 0, files_ = 0, documents_ = 0;
};

// A document's place: JSONL documents go wholly to validation, one in about 1/fraction
// (by a hash of their index, so the choice does not depend on the chunking).
bool to_validation(int64_t document, double fraction) {
  uint64_t x = static_cast<uint64_t>(document) + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) / 9007199254740992.0 < fraction;
}

struct Encoded {
  std::vector<int32_t> train, val;
  std::vector<int64_t> train_docs, val_docs;  // where each document starts in train and val
};

// Calls f(text, line number, document number) for each line of a JSONL work's text that is
// not blank: its field's string. InputError naming FILE:LINE for a line that is not such an
// object.
template <typename F>
void for_each_jsonl_document(const Work& w, F&& f) {
  int64_t line_no = w.first_line, doc = w.first_document;
  for (size_t at = 0; at < w.text.size(); ++line_no, ++doc) {
    const size_t end = w.text.find('\n', at);
    const std::string_view line(w.text.data() + at, end - at);
    at = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // a blank line
    const std::string where = cat(w.input->path.string(), ":", line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& ex) {
      throw InputError(cat(printable(where), ": not a JSON object (", ex.what(), ")"));
    }
    if (!j.is_object() || !j.contains(w.input->field) || !j[w.input->field].is_string())
      throw InputError(cat(printable(where), ": expected a JSON object with a string field \"", printable(w.input->field), "\""));
    f(j[w.input->field].get_ref<const std::string&>(), where, doc);
  }
}

// One piece of work's ids. A text file's last val_fraction goes to validation (from the
// start of a line for a tokenizer other than bytes); each document ends with
// <|endoftext|> where the tokenizer has one.
Encoded encode(Tokenizer& t, const Work& w, double val_fraction) {
  Encoded e;
  const int32_t eot = t.end_of_text();
  auto document = [&](std::string_view text, std::vector<int32_t>& into, std::vector<int64_t>& starts) {
    if (text.empty()) return;
    starts.push_back(static_cast<int64_t>(into.size()));
    t.encode(text, into);
    if (eot >= 0) into.push_back(eot);
  };
  if (!w.input->jsonl) {
    auto split = static_cast<size_t>(static_cast<double>(w.text.size()) * (1.0 - val_fraction));
    if (split < w.text.size() && !t.is_bytes()) {
      const size_t line = w.text.rfind('\n', split);
      split = line == std::string::npos ? split : line + 1;
    }
    document(std::string_view(w.text).substr(0, split), e.train, e.train_docs);
    document(std::string_view(w.text).substr(split), e.val, e.val_docs);
    return e;
  }
  for_each_jsonl_document(w, [&](const std::string& text, const std::string&, int64_t doc) {
    if (to_validation(doc, val_fraction))
      document(text, e.val, e.val_docs);
    else
      document(text, e.train, e.train_docs);
  });
  return e;
}

// One split's tokens into llm.c files: shards of `shard_tokens` (the last shorter) named
// PREFIX-NNNNNN.bin in `dir`, each with its document index PREFIX-NNNNNN.bin.idx.
class TokenSink {
 public:
  TokenSink(std::string dir, std::string prefix, int64_t shard_tokens, int dtype_bytes)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens), dtype_bytes_(dtype_bytes) {}
  // `starts`: where documents start in `ids`, in order.
  void add(std::span<const int32_t> ids, std::span<const int64_t> starts) {
    size_t next = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (next < starts.size() && starts[next] == static_cast<int64_t>(i)) {
        doc_starts_.push_back(static_cast<uint32_t>(buf_.size() / static_cast<size_t>(dtype_bytes_)));
        ++next;
      }
      if (dtype_bytes_ == 2) {
        const auto v = static_cast<uint16_t>(id);
        buf_.append(reinterpret_cast<const char*>(&v), 2);
      } else {
        const auto v = static_cast<uint32_t>(id);
        buf_.append(reinterpret_cast<const char*>(&v), 4);
      }
      if (static_cast<int64_t>(buf_.size()) == shard_tokens_ * dtype_bytes_) flush();
    }
    tokens_ += static_cast<int64_t>(ids.size());
  }
  // Writes what is left; the shards written.
  std::vector<ShardInfo> finish() {
    if (!buf_.empty()) flush();
    return std::move(shards_);
  }
  int64_t tokens() const { return tokens_; }

 private:
  void flush() {
    const int64_t count = static_cast<int64_t>(buf_.size()) / dtype_bytes_;
    int32_t header[kTokenHeaderWords] = {};
    header[0] = kTokenMagic;
    header[1] = dtype_bytes_ == 2 ? 1 : 2;
    header[2] = static_cast<int32_t>(count);
    const std::string_view head(reinterpret_cast<const char*>(header), sizeof header);
    char name_buf[64];
    std::snprintf(name_buf, sizeof name_buf, "%s-%06zu.bin", prefix_.c_str(), shards_.size());
    const std::string name = name_buf;
    write_file_atomic((fs::path(dir_) / name).string(), std::vector<std::string_view>{head, buf_});
    // The index: 0 first even when a document from the shard before goes on there.
    if (doc_starts_.empty() || doc_starts_.front() != 0) doc_starts_.insert(doc_starts_.begin(), 0);
    int32_t index_header[kTokenHeaderWords] = {kIndexMagic, 1, static_cast<int32_t>(doc_starts_.size())};
    const std::vector<std::string_view> index = {
        std::string_view(reinterpret_cast<const char*>(index_header), sizeof index_header),
        std::string_view(reinterpret_cast<const char*>(doc_starts_.data()), doc_starts_.size() * sizeof(uint32_t))};
    write_file_atomic((fs::path(dir_) / (name + ".idx")).string(), index);
    shards_.push_back({.location = name, .path = (fs::path(dir_) / name).string(), .tokens = count,
                       .dtype_bytes = dtype_bytes_, .sha256 = sha256_hex(std::vector<std::string_view>{head, buf_}),
                       .documents = static_cast<int64_t>(doc_starts_.size()), .index_sha256 = sha256_hex(index)});
    buf_.clear();
    doc_starts_.clear();
  }
  std::string dir_, prefix_;
  int64_t shard_tokens_;
  int dtype_bytes_;
  std::string buf_;
  std::vector<uint32_t> doc_starts_;  // documents starting in the shard being filled
  std::vector<ShardInfo> shards_;
  int64_t tokens_ = 0;
};

}  // namespace

std::vector<TextFile> read_text_sources(const std::vector<std::string>& sources) {
  std::vector<TextFile> out;
  const std::vector<Input> inputs = all_inputs(sources);
  Reader reader(inputs, size_t{4} << 20);
  for (Work w; reader.next(w);) {
    if (!w.input->jsonl) {
      out.push_back({w.input->path.string(), std::move(w.text)});
      continue;
    }
    for_each_jsonl_document(w, [&](const std::string& text, const std::string& where, int64_t) {
      out.push_back({where, text});
    });
  }
  return out;
}

PrepareResult prepare_text(const PrepareOptions& o, const Tokenizer& tokenizer) {
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw InputError(cat("data prepare: --val-fraction ", o.val_fraction, ": expected [0, 1)"));
  const bool one_file = !o.sharded;
  if (one_file && tokenizer.vocab_size() > 65536)
    throw InputError(cat("data prepare: tokenizer ", tokenizer.spec(), " has ", tokenizer.vocab_size(),
                         " ids; a token file holds uint16 ids (at most 65536): write uint32 shards with --shard-tokens"));
  if (!one_file && o.shard_tokens < 1)
    throw InputError(cat("data prepare: --shard-tokens ", o.shard_tokens, ": expected a positive count"));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Input> inputs = all_inputs(o.sources);
  PrepareResult r;
  std::string dir;
  if (one_file) {
    r.train_path = o.out;
    r.val_path = val_path_for(o.out);
    dir = fs::path(o.out).parent_path().string();
  } else {
    dir = o.out;
    r.train_path = (fs::path(dir) / "train.json").string();
    r.val_path = (fs::path(dir) / "val.json").string();
    for (const std::string& f : {r.train_path, r.val_path})
      if (std::error_code ec; fs::exists(f, ec))
        throw InputError(cat("--out ", printable(dir), " already holds a dataset (", fs::path(f).filename().string(),
                             "); choose another directory or remove it first"));
  }
  if (!dir.empty()) fs::create_directories(dir);
  const int dtype_bytes = tokenizer.vocab_size() > 65536 ? 4 : 2;
  const int64_t shard = one_file ? INT32_MAX : std::min<int64_t>(o.shard_tokens, INT32_MAX);
  TokenSink train(dir, one_file ? "" : "train", shard, dtype_bytes), val(dir, one_file ? "" : "val", shard, dtype_bytes);
  std::vector<int32_t> whole_train, whole_val;  // one_file: the legacy writer's input

  const int threads = std::max(1, o.threads > 0 ? o.threads : available_cores());
  std::vector<Tokenizer> encoders(static_cast<size_t>(threads), tokenizer);
  Reader reader(inputs, size_t{4} << 20);
  std::vector<Work> batch;
  auto last_print = std::chrono::steady_clock::now();
  const bool tty = o.progress && ::isatty(2);
  for (bool more = true; more;) {
    batch.clear();
    size_t bytes = 0;
    for (Work w; batch.size() < static_cast<size_t>(4 * threads) && bytes < (size_t{64} << 20) && (more = reader.next(w));) {
      bytes += w.text.size();
      batch.push_back(std::move(w));
    }
    std::vector<Encoded> done(batch.size());
    std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k)
      pool.emplace_back([&, k] {
        try {
          for (size_t i = static_cast<size_t>(k); i < batch.size(); i += static_cast<size_t>(threads))
            done[i] = encode(encoders[static_cast<size_t>(k)], batch[i], o.val_fraction);
        } catch (...) {
          errors[static_cast<size_t>(k)] = std::current_exception();
        }
      });
    for (auto& t : pool) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (const Encoded& e : done) {
      if (one_file) {
        whole_train.insert(whole_train.end(), e.train.begin(), e.train.end());
        whole_val.insert(whole_val.end(), e.val.begin(), e.val.end());
      } else {
        train.add(e.train, e.train_docs);
        val.add(e.val, e.val_docs);
      }
    }
    r.bytes += static_cast<int64_t>(bytes);
    if (tty && std::chrono::steady_clock::now() - last_print > std::chrono::milliseconds(500)) {
      last_print = std::chrono::steady_clock::now();
      const double s = std::chrono::duration<double>(last_print - t0).count();
      std::fprintf(stderr, "\rprepare: %lld files, %.1f MB, %lld tokens, %.1f MB/s   ", static_cast<long long>(reader.files()),
                   static_cast<double>(r.bytes) / 1e6,
                   static_cast<long long>(one_file ? whole_train.size() + whole_val.size() : train.tokens() + val.tokens()),
                   static_cast<double>(r.bytes) / 1e6 / s);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  r.files = reader.files();
  if (one_file) {
    if (whole_train.empty()) throw InputError("data prepare: the sources hold no text");
    auto narrow = [](const std::vector<int32_t>& ids) { return std::vector<uint16_t>(ids.begin(), ids.end()); };
    write_tokens(r.train_path, narrow(whole_train));
    write_tokens(r.val_path, narrow(whole_val));
    r.train_tokens = static_cast<int64_t>(whole_train.size());
    r.val_tokens = static_cast<int64_t>(whole_val.size());
  } else {
    if (train.tokens() == 0) throw InputError("data prepare: the sources hold no text");
    auto manifest = [&](TokenSink& sink, const std::string& path, int64_t& tokens, int64_t& shards) {
      Manifest m{.path = path, .shards = sink.finish(), .tokens = sink.tokens(), .vocab_size = tokenizer.vocab_size(),
                 .end_of_text = tokenizer.end_of_text(), .tokenizer = tokenizer.spec()};
      tokens = m.tokens;
      shards = static_cast<int64_t>(m.shards.size());
      if (m.shards.empty()) return std::string();
      write_file_atomic(path, manifest_json(m));
      return path;
    };
    manifest(train, r.train_path, r.train_tokens, r.train_shards);
    r.val_path = manifest(val, r.val_path, r.val_tokens, r.val_shards);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace loom::data
