// Loading a GPT to generate with or evaluate (`loom sample`, `loom eval`, `loom serve`,
// distillation's teacher): its shape read off a checkpoint or a bare safetensors file,
// checked before anything is built; int8 weights (docs/serving.md, "INT8 weights") where a
// checkpoint written by `loom quantize` holds them.
// Thread-safety: reentrant (each call reads its own checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/checkpoint/checkpoint.h"
#include "loom/data/tokenizer.h"
#include "loom/nn/gpt.h"

namespace loom::serve {

// "<weight name>_scale": an int8 weight's per-output-channel scales (F32).
inline constexpr const char* kInt8ScaleSuffix = "_scale";

// What errors about a checkpoint's weights name: the file, or the directory's index.json.
std::string index_of(const checkpoint::Checkpoint& ck);

// The shape of the GPT a checkpoint holds, from state.json or read off a bare safetensors
// file (`n_head` then says what the file cannot), checked to make a GPT and to agree with
// the weights' shapes; nothing is loaded. InputError names the file and field.
nn::GptConfig gpt_shape_of(const checkpoint::Checkpoint& ck, int64_t n_head);
// The GPT a checkpoint holds (shape as gpt_shape_of), checked against the weights before it
// is built. Warns about NaN or Inf weights. InputError names the file and field.
// int8: compute with int8 weights, quantized now from f32 ones; a checkpoint written by
// `loom quantize` always loads as int8.
std::unique_ptr<nn::Gpt> load_gpt(const checkpoint::Checkpoint& ck, int64_t n_head, bool int8 = false);
// load_gpt for decoding: f32 weights go into panels (Gpt::use_panels: the same bits, faster
// few-row products).
std::unique_ptr<nn::Gpt> load_gpt_for_decoding(const checkpoint::Checkpoint& ck, int64_t n_head, bool int8);

// The tokenizer a model's text goes through: `spec` when given (--tokenizer), else the
// one the checkpoint keeps (tokenizer/encoder.json and vocab.bpe, verified), else bytes for
// a vocabulary of at most 256; nullopt when none is known (the model then reads and writes
// token ids). InputError when the tokenizer has more ids than the model's vocabulary.
std::optional<data::Tokenizer> model_tokenizer(const checkpoint::Checkpoint& ck, const std::string& spec, int64_t vocab);
// How many newlines each id's bytes hold (what --lines counts).
std::vector<uint8_t> newlines_per_token(const data::Tokenizer& t);

// Whether a checkpoint holds int8 weights (written by loom quantize).
bool holds_int8(const checkpoint::Checkpoint& ck);
// Fills `gpt` from such a checkpoint: the f32 tensors as they are, the int8 weights with
// their scales through Gpt::use_int8. InputError naming the file and tensor when one is
// missing or of another dtype or shape.
void load_int8(const checkpoint::Checkpoint& ck, nn::Gpt& gpt);
// What Gpt::weight_bytes() gives for a GPT of this shape as load_gpt_for_decoding makes it
// (int8 weights, or f32 ones in panels), without building one.
int64_t gpt_weight_bytes(const nn::GptConfig& g, bool int8);

// --quantize's value: "none" (false) or "int8" (true); InputError for any other.
bool quantize_named(const std::string& value);
// --kv-cache-dtype's value: "f32" or "bf16" (the keys and values of an f32 model kept in
// bf16: half the memory, docs/serving.md); InputError for any other.
DType kv_cache_dtype_named(const std::string& value);

}  // namespace loom::serve
