// Tokenizers as a user meets them (docs/data.md): `loom tokenizer train|encode|decode`,
// `loom data prepare --tokenizer`, a run that keeps its tokenizer in its directory and its
// checkpoints, and sample, eval and serve speaking text through it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_fixture.h"
#include "loom/core/fileio.h"
#include "loom/data/data.h"
#include "serve_fixture.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

// Text with words worth merging, accents and a line of symbols.
std::string corpus() {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += cat("The quick brown fox ", i, " jumps over the lazy dog. Caf\xc3\xa9 na\xc3\xafve! It's time.\n");
  return text;
}

TEST_F(Cli, TokenizerTrainsOnceDeterministicallyAndRoundTrips) {
  write(p("c.txt"), corpus());
  Result r = loom(cat("tokenizer train text:", p("c.txt"), " --vocab-size 300 --out ", p("tok")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("vocabulary 300, <|endoftext|> = 299"), std::string::npos) << r.out;
  ASSERT_EQ(loom(cat("tokenizer train text:", p("c.txt"), " --vocab-size 300 --out ", p("tok2"))).code, 0);
  for (const char* f : {"encoder.json", "vocab.bpe"})
    EXPECT_EQ(read_file(p(cat("tok/", f))), read_file(p(cat("tok2/", f)))) << f << ": the same text, the same files";

  // A directory that holds a tokenizer is not written over.
  const std::string before = read_file(p("tok/vocab.bpe"));
  r = loom(cat("tokenizer train text:", p("c.txt"), " --vocab-size 290 --out ", p("tok")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("already holds a tokenizer (encoder.json)"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(p("tok/vocab.bpe")), before);

  // encode | decode gives the bytes back, invalid UTF-8 included; merges shorten the text.
  const std::string probe = "The lazy fox's caf\xc3\xa9 \xff\xfe jumps.\n";
  write(p("probe.txt"), probe);
  r = loom(cat("tokenizer encode --tokenizer ", p("tok"), " ", p("probe.txt")));
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t ids = std::count(r.out.begin(), r.out.end(), ' ') + 1;
  EXPECT_LT(ids, probe.size() * 3 / 4) << r.out;
  write(p("ids.txt"), r.out);
  r = loom(cat("tokenizer decode --tokenizer ", p("tok"), " ", p("ids.txt")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, probe);
  r = loom(cat("tokenizer encode --tokenizer bytes - < ", p("probe.txt")));
  EXPECT_TRUE(r.out.starts_with("84 104 101 32")) << r.out;

  // Bad input: one line naming what was expected, exit 2.
  write(p("bad_ids.txt"), "12 x7 3");
  r = loom(cat("tokenizer decode --tokenizer ", p("tok"), " ", p("bad_ids.txt")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("bad_ids.txt: id 2 is \"x7\", expected an integer 0 to 299"), std::string::npos) << r.err;
  write(p("big_ids.txt"), "300");
  EXPECT_EQ(loom(cat("tokenizer decode --tokenizer ", p("tok"), " ", p("big_ids.txt"))).code, 2);
  r = loom(cat("tokenizer train text:", p("c.txt"), " --vocab-size 100 --out ", p("tok3")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--vocab-size"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(p("tok3")));
  r = loom(cat("tokenizer encode --tokenizer nonsense:x ", p("probe.txt")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("expected bytes, gpt2:DIR, hf:tokenizer.json"), std::string::npos) << r.err;
}

TEST_F(Cli, ARunKeepsItsTokenizerAndSampleAndEvalSpeakIt) {
  write(p("c.txt"), corpus());
  ASSERT_EQ(loom(cat("tokenizer train text:", p("c.txt"), " --vocab-size 300 --out ", p("tok"))).code, 0);
  Result r = loom(cat("data prepare text:", p("c.txt"), " --tokenizer ", p("tok"), " --out ", p("d/c.bin")));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<uint16_t> tokens = data::read_tokens(p("d/c.bin"));
  EXPECT_LT(tokens.size(), corpus().size() / 2) << "BPE ids, not bytes";
  EXPECT_GT(*std::max_element(tokens.begin(), tokens.end()), 255);

  const std::string run = cat("train ", p("nano.toml"), " --quiet --training.steps=3 --data.train=", p("d/c.bin"),
                              " --data.val=", p("d/c_val.bin"), " --data.tokenizer=", p("tok"));
  // The model must hold every id the tokenizer makes; refused before anything is written.
  r = loom(run + " --model.vocab_size=256");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("has 300 ids, but model.vocab_size = 256"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(p("runs/r/checkpoints")));
  r = loom(run + " --model.vocab_size=300");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"runs/r/tokenizer/encoder.json", "runs/r/checkpoints/step_3/tokenizer/vocab.bpe"})
    EXPECT_EQ(read_file(p(f)), read_file(p(cat("tok/", fs::path(f).filename().string())))) << f;
  r = loom(cat("ckpt verify ", p("runs/r/checkpoints/step_3")));
  EXPECT_EQ(r.code, 0) << r.err;

  // Prompts and output are text through the run's tokenizer.
  r = loom(cat("sample --checkpoint ", p("runs/r"), " --tokens 12 --prompt \"The quick\""));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("The quick")) << r.out;
  r = loom(cat("eval --checkpoint ", p("runs/r"), " --data text:", p("c.txt")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("{\"loss\": ")) << r.out;
  // --tokenizer bytes cannot speak for a 300-id model's checkpoint? It can: bytes are ids
  // 0-255, inside the vocabulary; the prompt is then read byte by byte.
  r = loom(cat("sample --checkpoint ", p("runs/r"), " --tokens 4 --prompt Th --tokenizer bytes"));
  EXPECT_EQ(r.code, 0) << r.err;

  // Exported weights take the tokenizer along as a Hugging Face tokenizer.json, which reads
  // back to the same ids; pruned and quantized checkpoints keep it.
  fs::create_directories(p("hf"));
  r = loom(cat("ckpt export ", p("runs/r"), " --out ", p("hf/model.safetensors")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("tokenizer.json: the run's tokenizer (vocabulary 300)"), std::string::npos) << r.out;
  write(p("probe.txt"), "The lazy fox jumps.\n");
  const Result via_hf = loom(cat("tokenizer encode --tokenizer hf:", p("hf/tokenizer.json"), " ", p("probe.txt")));
  const Result via_run = loom(cat("tokenizer encode --tokenizer ", p("runs/r/tokenizer"), " ", p("probe.txt")));
  ASSERT_EQ(via_hf.code, 0) << via_hf.err;
  EXPECT_EQ(via_hf.out, via_run.out);
  ASSERT_EQ(loom(cat("prune --checkpoint ", p("runs/r"), " --sparsity 0.5 --out ", p("pruned"))).code, 0);
  ASSERT_EQ(loom(cat("quantize --checkpoint ", p("runs/r"), " --out ", p("q8"))).code, 0);
  for (const char* dir : {"pruned/step_0", "q8/step_0"})
    EXPECT_EQ(read_file(p(cat(dir, "/tokenizer/vocab.bpe"))), read_file(p("tok/vocab.bpe"))) << dir;
  r = loom(cat("sample --checkpoint ", p("q8"), " --tokens 4 --prompt \"The quick\""));
  EXPECT_TRUE(r.out.starts_with("The quick")) << r.out << r.err;

  // A tokenizer file changed in the checkpoint is found before it is used.
  {
    std::ofstream f(p("runs/r/checkpoints/step_3/tokenizer/vocab.bpe"), std::ios::app);
    f << "x y\n";
  }
  r = loom(cat("sample --checkpoint ", p("runs/r/checkpoints/step_3"), " --tokens 4"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("tokenizer/vocab.bpe: 308 bytes, index.json says 304: the checkpoint is corrupt"), std::string::npos)
      << r.err;
  EXPECT_EQ(loom(cat("ckpt verify ", p("runs/r/checkpoints/step_3"))).code, 2);
}

TEST_F(Serve, AStringPromptGoesThroughTheModelsTokenizer) {
  write(p("c.txt"), corpus());
  ASSERT_EQ(loom(cat("tokenizer train text:", p("c.txt"), " --vocab-size 300 --out ", p("tok"))).code, 0);
  ASSERT_EQ(loom(cat("data prepare text:", p("c.txt"), " --tokenizer ", p("tok"), " --out ", p("d/c.bin"))).code, 0);
  ASSERT_EQ(loom(cat("train ", p("nano.toml"), " --quiet --training.steps=3 --job.name=b --data.train=", p("d/c.bin"),
                     " --data.val=", p("d/c_val.bin"), " --data.tokenizer=", p("tok"), " --model.vocab_size=300"))
                .code,
            0);
  // "b" keeps its own tokenizer; "n" (bytes) is read byte by byte; "ids" has its tokenizer
  // replaced by a flag.
  start({"--model", cat("b=", p("runs/b")), "--model", cat("n=", p("runs/n")), "--model", cat("ids=", p("runs/b")),
         "--tokenizer", cat("ids=", p("tok")), "--lanes", "1", "--job.threads=1"});
  const json request = {{"model", "b"}, {"prompt", "The quick brown"}, {"max_tokens", 6}, {"seed", 3}};
  auto [status, body] = complete(request);
  ASSERT_EQ(status, 200) << body.dump();
  write(p("prompt.txt"), "The quick brown");
  const Result ids = loom(cat("tokenizer encode --tokenizer ", p("tok"), " ", p("prompt.txt")));
  EXPECT_EQ(body["usage"]["prompt_tokens"], std::count(ids.out.begin(), ids.out.end(), ' ') + 1) << ids.out;
  EXPECT_LT(body["usage"]["prompt_tokens"], 15) << "words the BPE learned, not 15 bytes";
  EXPECT_EQ(body["usage"]["completion_tokens"], 6);
  EXPECT_TRUE(body["choices"][0]["text"].is_string());
  json bytes = request;
  bytes["model"] = "n";
  std::tie(status, body) = complete(bytes);
  ASSERT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["usage"]["prompt_tokens"], 15);
  json same = request;
  same["model"] = "ids";
  EXPECT_EQ(complete(same).second["choices"][0]["text"], complete(request).second["choices"][0]["text"]);
}

TEST_F(Serve, ATokenizerFlagForAnUnknownModelIsRefused) {
  const Result r = loom(cat("serve --port 0 --model n=", p("runs/n"), " --tokenizer x=bytes"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tokenizer x=bytes: no model named x"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace loom
