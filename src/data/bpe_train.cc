// Training a byte-level BPE: count the pieces GPT-2's pattern cuts the text into, then
// merge the most frequent adjacent pair until the vocabulary is full. Pair counts are kept
// up to date incrementally (only the pieces holding the merged pair are revisited), and a
// heap of (count, pair) entries, checked against the live count when popped, finds the
// next pair. Ties go to the pair whose bytes sort first, so the result depends on the
// text alone.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "bpe_vocab.h"
#include "loom/core/error.h"

namespace loom::data {
namespace {

using Pair = uint64_t;
Pair pair_of(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
int32_t left_of(Pair p) { return static_cast<int32_t>(p >> 32); }
int32_t right_of(Pair p) { return static_cast<int32_t>(p & 0xffffffffu); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

}  // namespace

TrainBpeResult train_bpe(std::span<const std::string> texts, const TrainBpeOptions& o) {
  if (o.vocab_size < 257 || o.vocab_size > (int64_t{1} << 24))
    throw InputError(cat("tokenizer train: --vocab-size ", o.vocab_size,
                         ": expected 257 to 16777216 (256 bytes, the merges, and <|endoftext|>)"));
  if (o.min_frequency < 1) throw InputError(cat("tokenizer train: --min-frequency ", o.min_frequency, ": expected >= 1"));
  TrainBpeResult result{.tokenizer = Tokenizer::bytes()};

  // Pieces and their counts; <|endoftext|> separates documents and is not learned from.
  const std::string eot = "<|endoftext|>";
  std::unordered_map<std::string_view, int64_t> counts;
  std::vector<std::string_view> pieces;
  for (const std::string& text : texts) {
    result.bytes += static_cast<int64_t>(text.size());
    std::string_view rest(text);
    for (;;) {
      const size_t cut = rest.find(eot);
      pieces.clear();
      pretokenize(rest.substr(0, cut), pieces);
      for (std::string_view p : pieces) ++counts[p];
      result.pieces += static_cast<int64_t>(pieces.size());
      if (cut == std::string_view::npos) break;
      rest.remove_prefix(cut + eot.size());
    }
  }
  result.distinct_pieces = static_cast<int64_t>(counts.size());

  std::vector<std::string> tokens(256);
  std::array<int32_t, 256> id_of_byte{};
  for (int b = 0; b < 256; ++b) {
    tokens[b] = std::string(1, static_cast<char>(byte_of_base_id(b)));
    id_of_byte[byte_of_base_id(b)] = b;
  }
  // Pieces in byte order, so the work below does not depend on the hash map's order.
  std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [piece, n] : sorted) {
    if (piece.size() < 2) continue;
    Word w{.symbols = {}, .count = n};
    for (char ch : piece) w.symbols.push_back(id_of_byte[static_cast<unsigned char>(ch)]);
    words.push_back(std::move(w));
  }

  std::unordered_map<Pair, int64_t> pair_count;
  std::unordered_map<Pair, std::vector<int32_t>> pair_words;  // may repeat a word, or hold one that lost the pair
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Pair p = pair_of(s[i], s[i + 1]);
      pair_count[p] += words[w].count;
      auto& list = pair_words[p];
      if (list.empty() || list.back() != static_cast<int32_t>(w)) list.push_back(static_cast<int32_t>(w));
    }
  }

  struct Cand {
    int64_t count;
    Pair pair;
  };
  // The better candidate: more frequent, then the pair whose bytes sort first.
  auto worse = [&](const Cand& x, const Cand& y) {
    if (x.count != y.count) return x.count < y.count;
    const std::string& xa = tokens[left_of(x.pair)];
    const std::string& ya = tokens[left_of(y.pair)];
    if (xa != ya) return xa > ya;
    return tokens[right_of(x.pair)] > tokens[right_of(y.pair)];
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  for (const auto& [p, n] : pair_count) heap.push({n, p});

  std::unordered_map<std::string, int32_t> id_of_token;
  for (int b = 0; b < 256; ++b) id_of_token.emplace(tokens[b], b);
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<int64_t> last_visit(words.size(), -1);
  std::unordered_set<Pair> changed;
  const int64_t target = o.vocab_size - 1;  // the last id is <|endoftext|>
  for (int64_t step = 0; static_cast<int64_t>(tokens.size()) < target && !heap.empty(); ++step) {
    const Cand top = heap.top();
    heap.pop();
    const auto live = pair_count.find(top.pair);
    if (live == pair_count.end() || live->second != top.count) continue;  // stale
    if (top.count < o.min_frequency) break;
    const int32_t a = left_of(top.pair), b = right_of(top.pair);
    const std::string joined = tokens[a] + tokens[b];
    int32_t made;
    if (const auto it = id_of_token.find(joined); it != id_of_token.end()) {
      made = it->second;  // the same bytes from another split: no new token, no new merge line
    } else {
      made = static_cast<int32_t>(tokens.size());
      tokens.push_back(joined);
      id_of_token.emplace(joined, made);
      merges.emplace_back(a, b);
    }
    changed.clear();
    auto add = [&](Pair p, int64_t n, int32_t w) {
      int64_t& c = pair_count[p];
      c += n;
      changed.insert(p);
      if (n > 0) {
        auto& list = pair_words[p];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
    };
    const std::vector<int32_t> holders = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    for (int32_t w : holders) {
      if (last_visit[w] == step) continue;
      last_visit[w] = step;
      Word& word = words[w];
      auto& s = word.symbols;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) add(pair_of(s[i], s[i + 1]), -word.count, w);
      std::vector<int32_t> out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(made);
          i += 2;
        } else {
          out.push_back(s[i++]);
        }
      }
      s = std::move(out);
      for (size_t i = 0; i + 1 < s.size(); ++i) add(pair_of(s[i], s[i + 1]), word.count, w);
    }
    for (Pair p : changed) {
      const auto it = pair_count.find(p);
      if (it->second <= 0) {
        pair_count.erase(it);
      } else if (p != top.pair) {
        heap.push({it->second, p});
      }
    }
    pair_count.erase(top.pair);
  }
  result.merges = static_cast<int64_t>(merges.size());
  tokens.push_back(eot);
  const int32_t eot_id = static_cast<int32_t>(tokens.size() - 1);
  result.tokenizer = Tokenizer::from_vocab(finish_vocab(std::move(tokens), merges, {eot_id}, "the trained vocabulary"),
                                           "trained");
  return result;
}

}  // namespace loom::data
