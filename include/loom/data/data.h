// Datasets: token files in llm.c's format, the byte-level tokenizer that makes them from
// text, IDX image files (Fashion-MNIST), and the seeded sampler that orders examples.
//
// Token file (docs/formats.md): 256 little-endian int32 header words (magic 20240520,
// version 1, token count, the rest 0), then `count` uint16 tokens.
// Every reader validates what it reads and throws InputError naming the file and what was
// expected; writers are atomic (temporary name, fsync, rename).
// Thread-safety: functions are reentrant; a Sampler is used by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

class Tokenizer;

constexpr int32_t kTokenMagic = 20240520;
constexpr int32_t kTokenVersion = 1;
constexpr int kTokenHeaderWords = 256;

std::vector<uint16_t> read_tokens(const std::string& path);
// The same from bytes already read from `path` (named in errors).
std::vector<uint16_t> parse_tokens(const std::string& path, std::string_view bytes);
void write_tokens(const std::string& path, std::span<const uint16_t> tokens);

// Byte-level tokenizer: token i is byte value i (vocabulary 256).
std::vector<uint16_t> byte_tokenize(std::string_view text);
std::string byte_detokenize(std::span<const int32_t> tokens);

struct PrepareOptions {
  // text:PATH (a file, a directory's files, a glob; each file one document) or
  // jsonl:PATH[:FIELD] (each line's string FIELD, "text" by default, one document).
  std::vector<std::string> sources;
  // One llm.c token file (and its validation file, _val before .bin); with `sharded`, a
  // directory of shards, train-NNNNNN.bin and val-NNNNNN.bin, with the manifests
  // train.json and val.json.
  std::string out;
  double val_fraction = 0.1;
  bool sharded = false;
  int64_t shard_tokens = 100'000'000;
  int threads = 0;        // encoding threads; 0: the cores this process may use
  bool progress = false;  // a progress line on stderr (when it is a terminal)
};
struct PrepareResult {
  std::string train_path, val_path;  // token files, or manifests (val_path "" when validation is empty)
  int64_t train_tokens = 0, val_tokens = 0, files = 0, bytes = 0, train_shards = 0, val_shards = 0;
  double seconds = 0;
};

// The documents of every source (PrepareOptions::sources) in order: a text file's whole
// text, or a JSONL line's field (path "FILE:LINE"); binary files and second paths to one
// file are skipped. InputError naming a source that does not exist or a bad JSONL line.
struct TextFile {
  std::string path, text;
};
std::vector<TextFile> read_text_sources(const std::vector<std::string>& sources);

// Encodes the sources' documents with `tokenizer` on several threads, in order, each
// ending with <|endoftext|> where the tokenizer has one, and writes the training and
// validation splits (docs/data.md): a text file's last val_fraction (from the start of a
// line for a tokenizer other than bytes), one JSONL document in about 1 / val_fraction.
PrepareResult prepare_text(const PrepareOptions& options, const Tokenizer& tokenizer);
// "data/x.bin" -> "data/x_val.bin"
std::string val_path_for(const std::string& out);

// Images with labels, pixels scaled to [0, 1], row-major (n, rows * cols).
struct ImageSet {
  int64_t n = 0, rows = 0, cols = 0;
  std::vector<float> pixels;
  std::vector<int32_t> labels;
};

// The most an IDX file may hold once decompressed: Fashion-MNIST's training images are
// 47 MB; a gzip bomb stops here instead of filling memory.
constexpr size_t kMaxIdxBytes = size_t{1} << 30;

// Reads an IDX3 ubyte image file and its IDX1 ubyte label file (gzip or plain).
ImageSet read_idx(const std::string& images_path, const std::string& labels_path);
// The same from the files' bytes (gzip or plain), each at most `max_bytes` once decompressed.
ImageSet parse_idx(const std::string& images_path, const std::string& images, const std::string& labels_path,
                   const std::string& labels, size_t max_bytes = kMaxIdxBytes);
// Fashion-MNIST from Debian's dataset-fashion-mnist: dir/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
ImageSet load_fashion_mnist(const std::string& dir, bool train);
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// How a Sampler permutes an epoch: kPermutation shuffles a table of every item (Fisher-Yates,
// 8 bytes per item: a token file's windows, images); kFeistel computes the permuted index
// (a 4-round Feistel network over the next power of four, walked back into range), with
// no table, for datasets of any size (sharded datasets).
enum class Order : uint8_t { kPermutation, kFeistel };

// Orders `items` examples: epoch e is a seeded random permutation of all of them, and
// global example index g (counted from the start of training) maps to
// permutation_{g / items}[g % items]. The cursor is just g, so resuming and sharding
// across ranks need no saved state beyond the step.
class Sampler {
 public:
  Sampler(int64_t items, uint64_t seed, Order order = Order::kPermutation);
  int64_t item(int64_t global_index);
  int64_t items() const { return items_; }

 private:
  int64_t items_;
  uint64_t seed_;
  Order order_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace loom::data
