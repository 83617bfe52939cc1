// Byte-level BPE (GPT-2's): encoding (pre-tokenization, then merges by rank with a piece
// cache) and decoding; the files are bpe_files.cc's. docs/data.md.
#include <algorithm>
#include <climits>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include "bpe_vocab.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom::data {
namespace fs = std::filesystem;

// ---- Tokenizer --------------------------------------------------------------------------

namespace {
struct PieceHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
}  // namespace

// Pieces encoded before (most words recur), and scratch space.
struct Tokenizer::Cache {
  static constexpr size_t kMaxPiece = 48, kMaxEntries = size_t{1} << 16;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, PieceHash, std::equal_to<>> where;  // piece -> ids
  std::vector<int32_t> ids;
  std::vector<std::pair<size_t, int32_t>> parts;
  std::vector<std::string_view> pieces;
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer Tokenizer::bytes() { return Tokenizer(); }

Tokenizer Tokenizer::load(const std::string& spec) {
  Tokenizer t;
  if (spec == "bytes") return t;
  if (spec.starts_with("hf:")) {
    t.vocab_ = parse_hf(read_file(spec.substr(3), size_t{1} << 30), spec.substr(3));
  } else if (spec.starts_with("gpt2:")) {
    t.vocab_ = load_gpt2_dir(spec.substr(5));
  } else if (std::error_code ec; fs::is_directory(spec, ec)) {
    t.vocab_ = load_gpt2_dir(spec);
  } else {
    throw InputError(cat("tokenizer \"", printable(spec), "\": expected bytes, gpt2:DIR, hf:tokenizer.json or a "
                         "directory holding encoder.json and vocab.bpe"));
  }
  t.spec_ = spec;
  t.cache_ = std::make_unique<Cache>();
  return t;
}

Tokenizer Tokenizer::from_vocab(std::shared_ptr<const Vocab> vocab, std::string spec) {
  Tokenizer t;
  t.vocab_ = std::move(vocab);
  t.spec_ = std::move(spec);
  t.cache_ = std::make_unique<Cache>();
  return t;
}

Tokenizer::Tokenizer(const Tokenizer& o) : vocab_(o.vocab_), spec_(o.spec_) {
  if (vocab_) cache_ = std::make_unique<Cache>();
}

Tokenizer& Tokenizer::operator=(const Tokenizer& o) {
  if (this != &o) *this = Tokenizer(o);
  return *this;
}

int64_t Tokenizer::vocab_size() const { return vocab_ ? static_cast<int64_t>(vocab_->tokens.size()) : 256; }
int32_t Tokenizer::end_of_text() const { return vocab_ ? vocab_->eot : -1; }

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw InputError(cat("token id ", id, " is outside the tokenizer's vocabulary of ", vocab_size()));
  if (!vocab_) {
    static const std::array<char, 256> all = [] {
      std::array<char, 256> a{};
      for (int b = 0; b < 256; ++b) a[b] = static_cast<char>(b);
      return a;
    }();
    return {&all[id], 1};
  }
  return vocab_->tokens[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

namespace {

// The merges of one piece of `n` >= 2 bytes, tiktoken's way: repeatedly join the adjacent
// parts whose joined bytes have the lowest rank, the leftmost of equal ranks. Quadratic in
// the piece's parts, so long pieces take the heap below.
void merge_short(const Tokenizer::Vocab& v, std::string_view p, std::vector<std::pair<size_t, int32_t>>& parts,
                 std::vector<int32_t>& out) {
  auto rank = [&](size_t from, size_t to) {
    const auto it = v.entries.find(p.substr(from, to - from));
    return it == v.entries.end() ? INT32_MAX : it->second.rank;
  };
  parts.clear();
  for (size_t i = 0; i <= p.size(); ++i) parts.emplace_back(i, INT32_MAX);
  for (size_t i = 0; i + 2 < parts.size(); ++i) parts[i].second = rank(parts[i].first, parts[i + 2].first);
  for (;;) {
    size_t best = 0;
    int32_t r = INT32_MAX;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].second < r) r = parts[i].second, best = i;
    if (r == INT32_MAX) break;
    auto get = [&](size_t i) { return i + 3 < parts.size() ? rank(parts[i].first, parts[i + 3].first) : INT32_MAX; };
    if (best > 0) parts[best - 1].second = get(best - 1);
    parts[best].second = get(best);
    parts.erase(parts.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    out.push_back(v.entries.find(p.substr(parts[i].first, parts[i + 1].first - parts[i].first))->second.id);
}

// The same merges for a long piece: candidate joins in a heap keyed (rank, start), parts in
// a linked list; a candidate is stale when either part has changed since it was pushed.
void merge_long(const Tokenizer::Vocab& v, std::string_view p, std::vector<int32_t>& out) {
  const size_t n = p.size();
  std::vector<size_t> next(n), prev(n);
  std::vector<uint32_t> version(n, 0);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;  // prev[0] wraps: never read
  struct Cand {
    int32_t rank;
    size_t left, right;
    uint32_t vl, vr;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](size_t l) {
    const size_t r = next[l];
    if (r >= n) return;
    const auto it = v.entries.find(p.substr(l, next[r] - l));
    if (it != v.entries.end() && it->second.rank != INT32_MAX) heap.push({it->second.rank, l, r, version[l], version[r]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || version[c.left] != c.vl || version[c.right] != c.vr || next[c.left] != c.right)
      continue;
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.left] < n) prev[next[c.left]] = c.left;
    ++version[c.left];
    if (c.left > 0) push(prev[c.left]);  // its join with us changed (version[c.left] made the old one stale)
    push(c.left);
  }
  for (size_t i = 0; i < n; i = next[i]) out.push_back(v.entries.find(p.substr(i, next[i] - i))->second.id);
}

}  // namespace

void merge_piece(const Tokenizer::Vocab& v, std::string_view piece, std::vector<int32_t>& out, bool long_path) {
  std::vector<std::pair<size_t, int32_t>> parts;
  if (long_path) {
    merge_long(v, piece, out);
  } else {
    merge_short(v, piece, parts, out);
  }
}

const Tokenizer::Vocab& vocab_of(const Tokenizer& t) {
  LOOM_CHECK(!t.is_bytes());
  return *t.vocab_;
}

void Tokenizer::encode_piece(std::string_view p, std::vector<int32_t>& out) {
  const Vocab& v = *vocab_;
  if (p.size() == 1) {
    out.push_back(v.byte_id[static_cast<unsigned char>(p[0])]);
    return;
  }
  if (const auto it = v.entries.find(p); it != v.entries.end()) {
    out.push_back(it->second.id);
    return;
  }
  Cache& c = *cache_;
  const bool cacheable = p.size() <= Cache::kMaxPiece;
  if (cacheable) {
    if (const auto it = c.where.find(p); it != c.where.end()) {
      out.insert(out.end(), c.ids.begin() + it->second.first, c.ids.begin() + it->second.first + it->second.second);
      return;
    }
  }
  const size_t before = out.size();
  if (p.size() <= 256) {
    merge_short(v, p, c.parts, out);
  } else {
    merge_long(v, p, out);
  }
  if (cacheable) {
    if (c.where.size() >= Cache::kMaxEntries) c.where.clear(), c.ids.clear();
    c.where.emplace(std::string(p), std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(c.ids.size()),
                                                                   static_cast<uint32_t>(out.size() - before)));
    c.ids.insert(c.ids.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
  }
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) {
  std::vector<std::string_view>& pieces = cache_->pieces;
  pieces.clear();
  pretokenize(text, pieces);
  for (std::string_view p : pieces) encode_piece(p, out);
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  if (!vocab_) {
    for (char ch : text) out.push_back(static_cast<unsigned char>(ch));
    return;
  }
  const Vocab& v = *vocab_;
  size_t at = 0;
  while (at < text.size()) {
    size_t first = std::string_view::npos;
    int32_t which = -1;
    for (int32_t s : v.specials) {
      const size_t f = text.find(v.tokens[s], at);
      if (f < first || (f == first && f != std::string_view::npos && v.tokens[s].size() > v.tokens[which].size()))
        first = f, which = s;
    }
    if (first == std::string_view::npos) {
      encode_ordinary(text.substr(at), out);
      break;
    }
    encode_ordinary(text.substr(at, first - at), out);
    out.push_back(which);
    at = first + v.tokens[which].size();
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

}  // namespace loom::data
