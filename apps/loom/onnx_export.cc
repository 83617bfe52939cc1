// `loom ckpt export --format onnx` (docs/formats.md, "ONNX"): the GPT a checkpoint holds as
// an ONNX graph (loom/serve/onnx.h).
#include <cstdio>

#include "commands.h"
#include "infer.h"
#include "loom/checkpoint/checkpoint.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/serve/gpt_loading.h"
#include "loom/serve/onnx.h"

namespace loom::app {

int export_onnx(const checkpoint::Checkpoint& ck, int64_t n_head, const std::string& out) {
  std::unique_ptr<nn::Gpt> gpt = serve::load_gpt(ck, n_head);
  if (gpt->int8()) throw InputError(cat(ck.path(), ": int8 weights (loom quantize) do not export to ONNX; export the f32 checkpoint"));
  const std::string bytes = serve::onnx_graph(*gpt);
  write_file_atomic(out, bytes);
  const nn::GptConfig& g = gpt->config();
  std::printf("wrote %s: ONNX (opset 17), GPT n_layer %lld, d_model %lld, vocab %lld, window %lld; %zu bytes\n",
              printable(out).c_str(), static_cast<long long>(g.n_layer), static_cast<long long>(g.d_model), static_cast<long long>(g.vocab_size),
              static_cast<long long>(g.seq_len), bytes.size());
  return 0;
}

}  // namespace loom::app
