// The default job, shortened: the loss must fall by a clear margin on the built-in corpus,
// metrics must be written, and a run must be reproducible.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/tokenize_file.h"
#include "io/hf_folder.h"
#include "testing/compare.h"
#include "testing/shared_data.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/training_data.h"

namespace shardtrain::train {
namespace {

JobConfig short_default_job(const std::string& out_dir) {
  // The default job's shape and data, with fewer steps and a smaller width so it runs in
  // seconds on 2 cores.
  LoadedConfig c = load_config("", {"--model.dim=128", "--model.n_layers=2", "--model.ffn_dim=384",
                                    "--training.steps=60", "--training.seq_len=64", "--schedule.warmup_steps=10",
                                    "--eval.interval_steps=0", "--eval.batches=4", "--sample.tokens=40",
                                    "--run.output_dir=" + out_dir, "--logging.progress=off", "--training.device=cpu",
                                    "--logging.interval_steps=20"});
  return c.config;
}

TEST(Trainer, DefaultJobShortenedLearns) {
  const std::string out = (std::filesystem::temp_directory_path() / ("shardtrain_trainer_test_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(out);
  Trainer trainer(short_default_job(out));
  const TrainSummary s = trainer.run();
  ASSERT_EQ(s.steps.size(), 60u);
  const double first = s.steps.front().loss;
  double last10 = 0;
  for (size_t i = 50; i < 60; ++i) last10 += s.steps[i].loss / 10;
  // A byte-level model starts near ln(258) = 5.55 nats and learns byte frequencies and
  // common words within tens of steps; require a drop of over 2 nats.
  EXPECT_NEAR(first, std::log(258.0), 0.3);
  EXPECT_LT(last10, first - 2.0) << "first " << first << " last-10 mean " << last10;
  ASSERT_EQ(s.evals.size(), 1u);
  EXPECT_LT(s.evals.back().second, first - 2.0);
  EXPECT_FALSE(s.sample.empty());

  std::ifstream metrics(out + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    if (++lines == 1) {
      for (const char* k : {"\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_second\"", "\"time_forward_s\"",
                            "\"time_backward_s\"", "\"time_optimizer_s\"", "\"peak_host_bytes\""}) {
        EXPECT_NE(line.find(k), std::string::npos) << k << " missing from " << line;
      }
    }
  }
  EXPECT_EQ(lines, 61);  // 60 steps + 1 evaluation
}

// model.qk_norm with heads of their own (Qwen3's shape: 8 heads of 32 in a width of 128)
// trains from scratch as the default job does, learns its q_norm / k_norm weights (ones at
// first), and exports as a Hugging Face qwen3 model holding them; its checkpoint records the
// QK-norm.
TEST(Trainer, AQwen3StyleModelLearnsAndExportsAsQwen3) {
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_trainer_qwen3_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(out);
  LoadedConfig l = load_config("", {"--model.qk_norm=true", "--model.head_dim=32", "--model.dim=128",
                                    "--model.n_layers=2", "--model.ffn_dim=384", "--training.steps=60",
                                    "--training.seq_len=64", "--schedule.warmup_steps=10", "--eval.interval_steps=0",
                                    "--eval.batches=1", "--sample.tokens=0", "--run.output_dir=" + out,
                                    "--logging.progress=off", "--logging.level=error", "--training.device=cpu",
                                    "--export.folder=" + out + "/hf", "--export.dtype=f32",
                                    "--checkpoint.interval_steps=60"});
  Trainer trainer(l.config);
  const TrainSummary s = trainer.run();
  ASSERT_EQ(s.steps.size(), 60u);
  double last10 = 0;
  for (size_t i = 50; i < 60; ++i) last10 += s.steps[i].loss / 10;
  EXPECT_LT(last10, s.steps.front().loss - 2.0) << "first " << s.steps.front().loss << " last-10 mean " << last10;

  std::ifstream config_json(out + "/hf/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_json);
  EXPECT_EQ(config.at("model_type"), "qwen3");
  EXPECT_EQ(config.at("head_dim"), 32);
  const io::HfWeights hf(out + "/hf");
  for (const char* name : {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"}) {
    ASSERT_EQ(hf.get(name).numel, 32) << name;
    Tensor w = Tensor::empty({32}, DType::kF32);
    hf.read_range(name, 0, w);
    double moved = 0;
    for (int64_t i = 0; i < 32; ++i) moved = std::max(moved, std::abs(w.data<float>()[i] - 1.0));
    EXPECT_GT(moved, 1e-3) << name << " kept its initial ones";
  }
  const CheckpointInfo saved = read_checkpoint_info(resolve_checkpoint("auto", out + "/checkpoints"));
  EXPECT_TRUE(saved.config.qk_norm);
  EXPECT_EQ(saved.config.head_dim(), 32);
  std::filesystem::remove_all(out);
}

// eval.at_start: the held-out loss before the first step, logged as step 0, is the model's
// before training (a fresh model's, evaluated alone) and above the loss at the end.
TEST(Trainer, EvaluatesBeforeTheFirstStep) {
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_trainer_at_start_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.steps = 30;
  c.sample.tokens = 0;
  const double untrained = Trainer(c).evaluate().loss;
  c.eval.at_start = true;
  const TrainSummary s = Trainer(c).run();
  ASSERT_EQ(s.evals.size(), 2u);
  EXPECT_EQ(s.evals.front().first, 0);
  EXPECT_EQ(s.evals.front().second, untrained);
  EXPECT_NEAR(untrained, std::log(258.0), 0.3);
  EXPECT_EQ(s.evals.back().first, 30);
  EXPECT_LT(s.evals.back().second, untrained - 1.0);
  std::filesystem::remove_all(out);
}

TEST(Trainer, RunsAreReproducible) {
  const std::string out = (std::filesystem::temp_directory_path() / ("shardtrain_trainer_repro_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.steps = 3;
  c.schedule.warmup_steps = 1;
  c.sample.tokens = 0;
  c.training.grad_accum_steps = 2;
  const TrainSummary a = Trainer(c).run();
  const TrainSummary b = Trainer(c).run();
  for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
}

// training.fp8 on the CPU: every block linear goes through the FP8 twin (ops/fp8.h), exact
// emulation of the GPU's codes. Each recipe starts where f32 starts (an untrained model's
// near-uniform predictions barely move when its products keep 4 significant bits), learns, and
// stays near the f32 run; a resumed run repeats the straight one bit for bit; and widths that
// FP8 rows cannot take are refused before training.
TEST(Trainer, Fp8RecipesLearnOnTheCpuTwin) {
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_trainer_fp8_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.steps = 40;
  c.sample.tokens = 0;
  c.model.vocab_size = 272;  // the byte tokenizer's 258 rows padded to 16 (the FP8 head multiplies over them)
  const TrainSummary f32 = Trainer(c).run();
  auto last10 = [](const TrainSummary& s) {
    double m = 0;
    for (size_t i = s.steps.size() - 10; i < s.steps.size(); ++i) m += s.steps[i].loss / 10;
    return m;
  };
  for (const char* recipe : {"tensorwise", "rowwise", "blockwise", "tensorwise+head"}) {
    const std::string name = recipe;
    c.training.fp8 = name.substr(0, name.find('+'));
    c.training.fp8_head = name.ends_with("+head");  // the head's products too
    const TrainSummary s = Trainer(c).run();
    ASSERT_EQ(s.steps.size(), 40u) << recipe;
    std::printf("%s: first loss %.4f (f32 %.4f), last-10 mean %.4f (f32 %.4f)\n", recipe, s.steps[0].loss,
                f32.steps[0].loss, last10(s), last10(f32));
    EXPECT_NEAR(s.steps[0].loss, f32.steps[0].loss, 2e-3 * f32.steps[0].loss) << recipe;
    EXPECT_LT(last10(s), s.steps[0].loss - 1.5) << recipe << " learns";
    EXPECT_LT(std::abs(last10(s) / last10(f32) - 1), 0.05) << recipe << " stays near f32";
  }
  // resume: a checkpoint at step 3 of 6 continues as the straight run did
  c.training.fp8 = "blockwise";
  c.training.fp8_head = true;
  c.training.steps = 6;
  c.checkpoint.interval_steps = 3;
  c.checkpoint.dir = out + "/checkpoints";
  const TrainSummary straight = Trainer(c).run();
  JobConfig resumed_job = c;
  resumed_job.checkpoint.resume = c.checkpoint.dir + "/step_00000003";
  resumed_job.checkpoint.interval_steps = 0;
  const TrainSummary resumed = Trainer(resumed_job).run();
  ASSERT_EQ(resumed.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.steps[i].loss, straight.steps[3 + i].loss) << "resumed step " << i + 4;
  // a width that is not a multiple of 16 is named before any step
  c.model.ffn_dim = 200;
  c.checkpoint.interval_steps = 0;
  c.checkpoint.dir = out + "/no_checkpoints";  // beside the run above, which a new run would not resume
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(c); }, "model.ffn_dim / parallel.tensor_parallel = 200"));
  // the head's FP8 products need a recipe, and a vocabulary of 16-byte rows
  c.model.ffn_dim = 256;
  c.model.vocab_size = 260;
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(c); }, "model.vocab_size = 260 is not a multiple of 16"));
  c.training.fp8 = "off";
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(c); }, "but `training.fp8` is \"off\""));
  // the FP8 attention is cuDNN's: a CPU run is told so before any step
  c.training.fp8_head = false;
  c.model.vocab_size = 272;
  c.training.fp8_attention = true;
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(c); }, "`training.fp8_attention` = true runs cuDNN's FP8 attention on a GPU"));
  std::filesystem::remove_all(out);
}

// FP8 under every activation checkpointing policy: the recomputed products quantise the same
// values with the same scales (a recomputed tensor's amax is its forward's), so the gradients,
// and with them the losses, are bitwise those of keeping everything, as without FP8.
TEST(Trainer, Fp8GradientsAreTheSameUnderEveryCheckpointingPolicy) {
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_trainer_fp8_ac_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.steps = 4;
  c.sample.tokens = 0;
  for (const char* recipe : {"tensorwise", "blockwise"}) {
    c.training.fp8 = recipe;
    c.training.activation_checkpointing = "none";
    const TrainSummary kept = Trainer(c).run();
    for (const char* policy : {"pointwise", "selective", "full"}) {
      c.training.activation_checkpointing = policy;
      const TrainSummary s = Trainer(c).run();
      ASSERT_EQ(s.steps.size(), kept.steps.size());
      for (size_t i = 0; i < s.steps.size(); ++i)
        EXPECT_EQ(s.steps[i].loss, kept.steps[i].loss) << recipe << ", " << policy << ", step " << i + 1;
    }
  }
  std::filesystem::remove_all(out);
}

// Evaluation runs at least at the end: a held-out split smaller than one batch is refused
// before training, not after it (when the last checkpoint would not be written yet).
TEST(Trainer, HeldOutSplitTooSmallForOneBatchIsAnErrorBeforeTraining) {
  const std::string out = (std::filesystem::temp_directory_path() / ("shardtrain_trainer_val_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.batch_size = 100000;  // 6.4M tokens per batch: far more than the held-out fortunes
  try {
    Trainer t(c);
    ADD_FAILURE() << "a held-out split smaller than one batch was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the held-out split has"), std::string::npos) << m;
    EXPECT_NE(m.find("fewer than one evaluation batch (`training.batch_size` 100000 sequences of "
                     "`training.seq_len` 64 + 1 tokens)"),
              std::string::npos)
        << m;
  }
}


// parallel.offload moves a GPU's shards to host memory; on the CPU it is refused by name.
// A GPU-only setting on a CPU run: the trainer refuses it at construction, naming the key.
void expect_rejected_on_the_cpu(const char* key, void (*set)(JobConfig&)) {
  SCOPED_TRACE(key);
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_trainer_gpu_only_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.device = "cpu";
  set(c);
  try {
    Trainer t(c);
    ADD_FAILURE() << key << " was accepted on the CPU";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(std::string("`") + key + "` = true"), std::string::npos) << m;
    EXPECT_NE(m.find("trains on the CPU"), std::string::npos) << m;
  }
}

TEST(Trainer, OffloadOnTheCpuIsAnError) {
  expect_rejected_on_the_cpu("parallel.offload", [](JobConfig& c) { c.parallel.offload = true; });
  expect_rejected_on_the_cpu("training.offload_activations",
                             [](JobConfig& c) { c.training.offload_activations = true; });
}

TEST(Trainer, GradientsOnTheGpuNeedOffload) {
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("shardtrain_trainer_offload_grads_" + std::to_string(::getpid()))).string();
  JobConfig c = short_default_job(out);
  c.training.device = "cpu";
  c.parallel.offload_gradients = false;
  try {
    Trainer t(c);
    ADD_FAILURE() << "parallel.offload_gradients = false was accepted without parallel.offload";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`parallel.offload_gradients` = false"), std::string::npos) << e.what();
  }
}

std::string temp_name(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("shardtrain_trainer_" + name + "_" + std::to_string(::getpid())))
      .string();
}

// The built-in corpus tokenized once into a token file (a document per line) trains from it:
// the loss falls as it does on the text.
TEST(Trainer, LearnsFromATokenFile) {
  const std::string tok = temp_name("fortunes.sttok"), text = temp_name("fortunes.txt");
  {
    std::ofstream out(text);
    for (const std::string& d : data::load_fortunes()) out << d << "\n\n";
  }
  data::TokenizeFileOptions o;
  o.format = data::TextFormat::kLines;
  (void)data::tokenize_file(data::ByteTokenizer(), text, tok, o);
  JobConfig c = short_default_job(temp_name("tokens_out"));
  c.data.source = tok;  // format auto: found by the file's header
  c.training.steps = 40;
  c.sample.tokens = 0;
  const TrainSummary s = Trainer(c).run();
  double last5 = 0;
  for (size_t i = 35; i < 40; ++i) last5 += s.steps[i].loss / 5;
  EXPECT_NEAR(s.steps.front().loss, std::log(258.0), 0.3);
  EXPECT_LT(last5, s.steps.front().loss - 1.5);
  ASSERT_EQ(s.evals.size(), 1u);
  EXPECT_LT(s.evals.back().second, s.steps.front().loss - 1.5);
  std::filesystem::remove(tok);
  std::filesystem::remove(text);
}

// A model evaluated without training on a separate source, over all of it (eval.batches = 0):
// the same loss as naming every batch, and not the loss of its first batch alone.
TEST(Trainer, EvaluatesAWholeEvalSourceWithoutTraining) {
  const std::string eval = temp_name("eval_source.txt");
  {
    std::ofstream out(eval);
    const std::vector<std::string> docs = data::load_fortunes();
    for (size_t i = 0; i < 300 && i < docs.size(); ++i) out << docs[i] << "\n\n";
  }
  JobConfig c = short_default_job(temp_name("eval_only_out"));
  c.data.eval_source = eval;
  c.training.steps = 0;
  c.sample.tokens = 0;
  c.eval.batches = 0;
  const TrainSummary all = Trainer(c).run();
  ASSERT_EQ(all.evals.size(), 1u);
  const data::ByteTokenizer t;
  const int64_t available = open_training_data(c, t, t.vocab_size(), 1)->eval_batches(c.training.batch_size,
                                                                                       c.training.seq_len);
  ASSERT_GT(available, 2);
  c.eval.batches = available;
  EXPECT_EQ(Trainer(c).run().evals.back().second, all.evals.back().second);
  c.eval.batches = 1;
  EXPECT_NE(Trainer(c).run().evals.back().second, all.evals.back().second);
  std::filesystem::remove(eval);
}

// Prompt/response fine-tuning: the loss counts only the responses, which here follow from
// the prompts (a colour per animal), so it falls far below what whole documents would give.
TEST(Trainer, LearnsResponsesFromPromptResponseExamples) {
  const std::string jsonl = temp_name("sft.jsonl");
  {
    const char* animals[] = {"cat", "dog", "cow", "owl"};
    const char* colours[] = {"black", "brown", "white", "grey"};
    std::ofstream out(jsonl);
    for (int i = 0; i < 400; ++i)
      out << "{\"prompt\": \"The colour of the " << animals[i % 4] << " number " << i << " is \", \"response\": \""
          << colours[i % 4] << ".\"}\n";
  }
  JobConfig c = short_default_job(temp_name("sft_out"));
  c.data.source = jsonl;
  c.data.format = "sft";
  c.training.steps = 60;
  c.sample.tokens = 0;
  const TrainSummary s = Trainer(c).run();
  double last5 = 0;
  for (size_t i = 55; i < 60; ++i) last5 += s.steps[i].loss / 5;
  EXPECT_NEAR(s.steps.front().loss, std::log(258.0), 0.3);
  // 6-7 counted targets per example (the colour, ".", EOS); the colour follows from the animal.
  EXPECT_LT(last5, 1.0) << "first " << s.steps.front().loss;
  ASSERT_EQ(s.evals.size(), 1u);
  EXPECT_LT(s.evals.back().second, 1.0);
  std::filesystem::remove(jsonl);
}

// data.document_mask = auto: on for packed fine-tuning examples, off for one example per
// sequence and for document streams; on and off as given.
TEST(Trainer, DocumentMaskIsOnForPackedExamples) {
  const std::string jsonl = temp_name("mask.jsonl");
  std::ofstream(jsonl) << "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  DataSection d;
  d.source = jsonl;
  d.format = "sft";
  EXPECT_TRUE(resolve_document_mask(d));
  d.format = "chat";
  EXPECT_TRUE(resolve_document_mask(d));
  d.packing = false;
  EXPECT_FALSE(resolve_document_mask(d));
  d.format = "jsonl";
  d.packing = true;
  EXPECT_FALSE(resolve_document_mask(d));
  d.document_mask = "on";
  EXPECT_TRUE(resolve_document_mask(d));
  d.format = "sft";
  d.document_mask = "off";
  EXPECT_FALSE(resolve_document_mask(d));
  d = DataSection();  // the built-in corpus
  EXPECT_FALSE(resolve_document_mask(d));
  std::filesystem::remove(jsonl);
}

// Chat fine-tuning through the trainer with the Llama 3 tokenizer and its template.
TEST(Trainer, TrainsOnChatExamplesWithTheLlama3Template) {
  ST_REQUIRE_SHARED_DATA(dir);
  const std::string jsonl = temp_name("chat.jsonl");
  {
    std::ofstream out(jsonl);
    for (int i = 0; i < 60; ++i)
      out << "{\"messages\": [{\"role\": \"user\", \"content\": \"Say " << i
          << "\"}, {\"role\": \"assistant\", \"content\": \"" << i << "\"}]}\n";
  }
  JobConfig c = short_default_job(temp_name("chat_out"));
  c.data.source = jsonl;
  c.data.format = "chat";
  c.data.tokenizer = dir + "/tokenizers/llama3";
  c.data.val_fraction = 0.2;
  c.model.dim = 64;
  c.model.ffn_dim = 128;
  c.training.batch_size = 2;
  c.training.steps = 3;
  c.sample.tokens = 0;
  const TrainSummary s = Trainer(c).run();
  ASSERT_EQ(s.steps.size(), 3u);
  // A 128,256-token vocabulary: the first loss is near ln(128256) = 11.76 nats.
  EXPECT_NEAR(s.steps.front().loss, std::log(128256.0), 0.5);
  ASSERT_EQ(s.evals.size(), 1u);
  EXPECT_TRUE(std::isfinite(s.evals.back().second));
  std::filesystem::remove(jsonl);
}

// Prompt/response fine-tuning with Llama 2's SentencePiece-style tokenizer (BOS <s> = 1, EOS
// </s> = 2, 32,000 tokens), packed with the document mask, and a sample decoded with it.
TEST(Trainer, FineTunesWithTheLlama2Tokenizer) {
  const std::string tokenizer = testing::source_dir() + "/.deps/llama2-tokenizer";
  if (!std::filesystem::exists(tokenizer + "/tokenizer.json"))
    GTEST_SKIP() << tokenizer << "/tokenizer.json not found (scripts/setup.sh --tests builds it)";
  const std::string jsonl = temp_name("llama2_sft.jsonl");
  {
    std::ofstream out(jsonl);
    for (int i = 0; i < 80; ++i)
      out << "{\"prompt\": \"Question " << i << ": what is " << i % 7 << " plus one?\", \"response\": \" "
          << i % 7 + 1 << "\"}\n";
  }
  JobConfig c = short_default_job(temp_name("llama2_out"));
  c.data.source = jsonl;
  c.data.format = "sft";
  c.data.tokenizer = tokenizer;
  c.data.val_fraction = 0.2;
  c.model.dim = 64;
  c.model.ffn_dim = 128;
  c.training.batch_size = 2;
  c.training.steps = 3;
  c.sample.tokens = 4;
  c.sample.prompt = "Question 3:";
  Trainer trainer(c);
  EXPECT_EQ(trainer.tokenizer().bos_id(), 1);
  EXPECT_EQ(trainer.tokenizer().eos_id(), 2);
  EXPECT_EQ(trainer.tokenizer().vocab_size(), 32000);
  const TrainSummary s = trainer.run();
  ASSERT_EQ(s.steps.size(), 3u);
  EXPECT_NEAR(s.steps.front().loss, std::log(32000.0), 0.5);  // a 32,000-token vocabulary
  ASSERT_EQ(s.evals.size(), 1u);
  EXPECT_TRUE(std::isfinite(s.evals.back().second));
  EXPECT_TRUE(s.sample.starts_with("Question 3:")) << s.sample;

  // without a BOS token there are no documents to find: the mask is refused, naming the key
  const std::filesystem::path no_bos = temp_name("llama2_no_bos");
  std::filesystem::create_directories(no_bos);
  std::filesystem::copy_file(tokenizer + "/tokenizer.json", no_bos / "tokenizer.json");
  std::ofstream(no_bos / "tokenizer_config.json") << "{\"bos_token\": null, \"eos_token\": \"</s>\"}";
  c.data.tokenizer = no_bos.string();
  try {
    Trainer bad(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`data.document_mask` finds documents by their BOS token"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(no_bos);
  std::filesystem::remove(jsonl);
}

// A tiny job on the built-in corpus (seconds on 2 cores), with `poisoned` steps whose first
// gradient element is made NaN after the backward, as one bad batch would.
JobConfig tiny_job(const std::string& out) {
  std::filesystem::remove_all(out);
  LoadedConfig c = load_config("", {"--model.dim=40", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2",
                                    "--model.ffn_dim=52", "--model.max_seq_len=32", "--training.seq_len=24",
                                    "--training.batch_size=3", "--training.steps=6", "--training.device=cpu",
                                    "--schedule.warmup_steps=2", "--eval.interval_steps=0", "--eval.batches=1",
                                    "--sample.tokens=0", "--logging.progress=off", "--logging.level=error",
                                    "--run.output_dir=" + out});
  return c.config;
}

void poison_gradients(Trainer& t, const std::vector<int64_t>& poisoned) {
  t.set_after_backward([&t, poisoned](int64_t step) {
    if (std::find(poisoned.begin(), poisoned.end(), step) != poisoned.end())
      t.store().grad_shards()[0].data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  });
}

// training.nonfinite_skips: a step whose gradient norm is NaN is skipped (the weights and
// AdamW's step count stay, the data goes on), counted in the metrics and the summary, and the
// run goes on; with two micro-batches a step too.
TEST(Trainer, SkipsAStepWithANonFiniteGradient) {
  for (const int64_t accum : {1, 2}) {
    const std::string out = (std::filesystem::temp_directory_path() /
                             ("shardtrain_trainer_skip_" + std::to_string(accum) + "_" + std::to_string(::getpid())))
                                .string();
    JobConfig c = tiny_job(out);
    c.training.grad_accum_steps = accum;
    const TrainSummary clean = Trainer(c).run();
    Trainer t(c);
    std::vector<Tensor> before_3, after_3;
    t.set_after_backward([&](int64_t step) {
      if (step == 3) {
        before_3 = {testing::to_dtype(t.store().master_shards()[1], DType::kF32)};
        t.store().grad_shards()[0].data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      }
      if (step == 4) after_3 = {testing::to_dtype(t.store().master_shards()[1], DType::kF32)};
    });
    const TrainSummary s = t.run();
    ASSERT_EQ(s.steps.size(), 6u) << "grad_accum_steps " << accum;
    EXPECT_EQ(s.skipped_nonfinite, 1);
    for (const StepRecord& r : s.steps) EXPECT_EQ(r.skipped_nonfinite, r.step == 3) << "step " << r.step;
    EXPECT_TRUE(std::isnan(s.steps[2].grad_norm));
    EXPECT_EQ(t.optimizer().steps_taken(), 5);
    ASSERT_EQ(before_3.size(), 1u);
    ASSERT_EQ(after_3.size(), 1u);
    EXPECT_TRUE(testing::all_close(after_3[0], before_3[0], testing::kExact)) << "the skipped step changed the weights";
    // the steps before are the clean run's, and step 4 trains on step 4's batch (finite, different)
    EXPECT_EQ(s.steps[1].loss, clean.steps[1].loss);
    EXPECT_TRUE(std::isfinite(s.steps[5].loss));
    EXPECT_NE(s.steps[3].loss, clean.steps[3].loss);
    std::ifstream metrics(out + "/metrics.jsonl");
    std::vector<int64_t> skipped;
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.contains("loss")) continue;
      ASSERT_TRUE(j.contains("skipped_nonfinite")) << line;
      if (j["skipped_nonfinite"] == 1) skipped.push_back(j["step"]);
      if (j["step"] == 6) {
        EXPECT_EQ(j["skipped_nonfinite_total"], 1);
      }
    }
    EXPECT_EQ(skipped, std::vector<int64_t>{3});
    std::filesystem::remove_all(out);
  }
}

// More non-finite steps in a row than training.nonfinite_skips allows end the run naming the
// step, what was not finite and the key; 0 stops at the first.
TEST(Trainer, StopsAfterTooManyNonFiniteStepsInARow) {
  const std::string out =
      (std::filesystem::temp_directory_path() / ("shardtrain_trainer_diverged_" + std::to_string(::getpid()))).string();
  JobConfig c = tiny_job(out);
  c.training.nonfinite_skips = 2;
  {
    Trainer t(c);
    poison_gradients(t, {2, 4, 5, 6});  // step 3 ends the first run in a row
    std::string e;
    try {
      t.run();
    } catch (const std::exception& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("step 6: the gradient norm is nan, the 3 steps in a row whose loss or gradient norm is not "
                     "finite, more than training.nonfinite_skips = 2 allows"),
              std::string::npos)
        << e;
  }
  c.training.nonfinite_skips = 0;
  Trainer t(c);
  poison_gradients(t, {2});
  std::string e;
  try {
    t.run();
  } catch (const std::exception& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("step 2: the gradient norm is nan; lower optimizer.lr or check the data (training.nonfinite_skips = 0"),
            std::string::npos)
      << e;
  std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace shardtrain::train
