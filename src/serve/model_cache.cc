#include "loom/serve/model_cache.h"

#include <algorithm>

#include "loom/serve/gpt_loading.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/log.h"

namespace loom::serve {

struct ModelCache::Entry {
  Spec spec;
  nn::GptConfig shape;
  int64_t bytes = 0;  // its weights, as it computes with them
  bool int8 = false;
  std::shared_ptr<const data::Tokenizer> tokenizer;  // null: the model reads and writes ids
  std::shared_ptr<Model> model;  // null: not loaded
  bool loading = false;
  uint64_t used = 0;  // clock_ at its last request
};

namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

ModelCache::ModelCache(const std::vector<Spec>& specs, int64_t n_head, int64_t memory_bytes, bool int8,
                       MakeBatcher make_batcher)
    : n_head_(n_head), budget_(memory_bytes), make_batcher_(std::move(make_batcher)) {
  for (const Spec& s : specs) {
    auto e = std::make_unique<Entry>();
    e->spec = s;
    const auto ck = checkpoint::Checkpoint::open(s.path);
    e->shape = gpt_shape_of(ck, n_head);
    if (auto t = model_tokenizer(ck, s.tokenizer, e->shape.vocab_size)) e->tokenizer = std::make_shared<data::Tokenizer>(*t);
    e->int8 = int8 || holds_int8(ck);
    e->bytes = gpt_weight_bytes(e->shape, e->int8);
    entries_[s.name] = std::move(e);
  }
  std::unique_lock lock(mu_);
  for (const Spec& s : specs) {
    Entry& e = *entries_.at(s.name);
    if (budget_ > 0 && stats_.bytes + e.bytes > budget_) {
      log_info(cat("serve: model ", s.name, " (", mib(e.bytes), " MiB) loads on its first request"));
      continue;
    }
    load(e, lock);  // a failure at start is the user's to fix now: it propagates
  }
}

ModelCache::~ModelCache() = default;

bool ModelCache::has(const std::string& name) const { return entries_.contains(name); }

std::vector<std::string> ModelCache::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

int64_t ModelCache::vocab_size(const std::string& name) const { return entries_.at(name)->shape.vocab_size; }

std::shared_ptr<const data::Tokenizer> ModelCache::tokenizer(const std::string& name) const {
  return entries_.at(name)->tokenizer;
}

std::shared_ptr<Model> ModelCache::load(Entry& e, std::unique_lock<std::mutex>& lock) {
  e.loading = true;
  stats_.bytes += e.bytes;  // reserved now: a load beside this one sees the room it takes
  lock.unlock();  // other models are served meanwhile
  std::shared_ptr<Model> m;
  std::exception_ptr failed;
  try {
    m = std::make_shared<Model>();
    m->name = e.spec.name;
    m->path = e.spec.path;
    m->gpt = load_gpt_for_decoding(checkpoint::Checkpoint::open(e.spec.path), n_head_, e.int8);
    if (m->gpt->config().vocab_size != e.shape.vocab_size || m->gpt->weight_bytes() != e.bytes)
      throw InputError(cat(e.spec.path, ": the checkpoint changed since the server started"));
    m->batcher = make_batcher_(*m->gpt);
  } catch (...) {
    failed = std::current_exception();
  }
  lock.lock();
  e.loading = false;
  loaded_.notify_all();
  if (failed) {
    stats_.bytes -= e.bytes;
    ++stats_.failures;
    std::rethrow_exception(failed);
  }
  e.model = m;
  ++stats_.loads;
  return m;
}

bool ModelCache::make_room(int64_t bytes, const Entry& keep) {
  while (budget_ > 0 && stats_.bytes + bytes > budget_) {
    // The least recently used model that no request holds (the cache's is the only reference).
    Entry* victim = nullptr;
    for (auto& [name, e] : entries_)
      if (e.get() != &keep && e->model && e->model.use_count() == 1 && e->model->batcher->running() == 0 &&
          e->model->batcher->queued() == 0 && (victim == nullptr || e->used < victim->used))
        victim = e.get();
    if (victim == nullptr) return false;
    log_info(cat("serve: evicting model ", victim->spec.name, " (", mib(victim->bytes), " MiB, least recently used) for ",
                 keep.spec.name));
    victim->model.reset();
    stats_.bytes -= victim->bytes;
    ++stats_.evictions;
  }
  return true;
}

std::shared_ptr<Model> ModelCache::get(const std::string& name) {
  std::unique_lock lock(mu_);
  Entry& e = *entries_.at(name);
  e.used = ++clock_;
  loaded_.wait(lock, [&] { return !e.loading; });
  if (e.model) {
    ++stats_.hits;
    return e.model;
  }
  if (!make_room(e.bytes, e))
    throw ModelUnavailable(503, cat("model \"", name, "\" needs ", mib(e.bytes), " MiB and the models serving requests "
                                    "hold ", mib(stats_.bytes), " of the ", mib(budget_),
                                    " MiB of --memory-mb; try again later"));
  try {
    return load(e, lock);
  } catch (const Error& err) {
    log_warn(cat("serve: model ", name, " failed to load: ", err.what()));
    throw ModelUnavailable(503, cat("model \"", name, "\" failed to load: ", err.what()));
  }
}

std::map<std::string, std::shared_ptr<Model>> ModelCache::loaded() const {
  std::lock_guard lock(mu_);
  std::map<std::string, std::shared_ptr<Model>> out;
  for (const auto& [name, e] : entries_)
    if (e->model) out[name] = e->model;
  return out;
}

ModelCache::Stats ModelCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

Route::Route(const std::string& spec) {
  const size_t eq = spec.find('=');
  auto bad = [&] {
    return InputError(cat("--route ", printable(spec), ": expected NAME=MODEL:WEIGHT,MODEL:WEIGHT... (positive weights)"));
  };
  if (eq == 0 || eq == std::string::npos) throw bad();
  name_ = spec.substr(0, eq);
  std::string rest = spec.substr(eq + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string part = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const size_t colon = part.rfind(':');
    if (colon == 0 || colon == std::string::npos) throw bad();
    int64_t w = 0;
    size_t used = 0;
    try {
      w = std::stoll(part.substr(colon + 1), &used);
    } catch (...) {
      throw bad();
    }
    if (used != part.size() - colon - 1 || w <= 0 || w > (int64_t{1} << 30)) throw bad();
    targets_.emplace_back(part.substr(0, colon), w);
  }
  if (targets_.empty()) throw bad();
  current_.assign(targets_.size(), 0);
}

std::string Route::pick() {
  std::lock_guard lock(mu_);
  int64_t total = 0;
  size_t best = 0;
  for (size_t i = 0; i < targets_.size(); ++i) {
    current_[i] += targets_[i].second;
    total += targets_[i].second;
    if (current_[i] > current_[best]) best = i;
  }
  current_[best] -= total;
  return targets_[best].first;
}

}  // namespace loom::serve
