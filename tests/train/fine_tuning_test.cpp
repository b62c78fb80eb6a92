// Fine-tuning a Hugging Face folder: the defaults a job with model.hf takes for the keys it does
// not give (and their log line and print-config source), training.epochs as steps for examples
// and for token streams, and evaluation over a held-out split smaller than one batch, or none.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iterator>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/sft.h"
#include "testing/compare.h"
#include "testing/model_folders.h"
#include "testing/temp_folder.h"
#include "train/config.h"
#include "train/launch_defaults.h"
#include "train/trainer.h"
#include "train/training_data.h"

namespace shardtrain::train {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- the keys ----

TEST(FineTuningConfig, DefaultsApplyOnlyWithModelHfAndOnlyToKeysNotGiven) {
  const LoadedConfig scratch = load_config("", {});
  EXPECT_DOUBLE_EQ(scratch.config.optimizer.lr, 2e-3);
  EXPECT_EQ(scratch.config.schedule.warmup_steps, 30);
  EXPECT_EQ(scratch.config.schedule.warmup_fraction, 0);
  EXPECT_EQ(scratch.config.training.seq_len, 128);
  EXPECT_EQ(scratch.config.training.steps, 800);
  EXPECT_EQ(scratch.config.training.epochs, 0);
  EXPECT_TRUE(scratch.config.fine_tuning_defaults.empty());

  const LoadedConfig ft = load_config("", {"--model.hf=models/some-llama"});
  EXPECT_DOUBLE_EQ(ft.config.optimizer.lr, 2e-5);
  EXPECT_DOUBLE_EQ(ft.config.schedule.warmup_fraction, 0.03);
  EXPECT_EQ(ft.config.training.seq_len, 0);  // auto, chosen at launch
  EXPECT_DOUBLE_EQ(ft.config.training.epochs, 1);
  for (const char* k : {"optimizer.lr", "schedule.warmup_fraction", "training.seq_len", "training.epochs"})
    EXPECT_EQ(ft.sources.at(k), ValueSource::kFineTuning) << k;
  // and eval.enabled, which stays true unless the held-out split turns out empty
  EXPECT_EQ(ft.config.fine_tuning_defaults.size(), 5u);
  EXPECT_TRUE(ft.config.eval.enabled);
  EXPECT_EQ(ft.sources.at("optimizer.beta2"), ValueSource::kDefault);  // no fine-tuning default of its own

  // given in a file or on the command line, a key keeps its value
  const std::string toml =
      (std::filesystem::temp_directory_path() / fmt::format("shardtrain_ft_given_{}.toml", ::getpid())).string();
  std::ofstream(toml) << "[optimizer]\nlr = 1e-4\n[training]\nsteps = 50\n";
  const LoadedConfig given = load_config(toml, {"--model.hf=models/some-llama", "--schedule.warmup_steps=7",
                                                "--training.seq_len=96", "--eval.enabled=true"});
  EXPECT_DOUBLE_EQ(given.config.optimizer.lr, 1e-4);
  EXPECT_EQ(given.sources.at("optimizer.lr"), ValueSource::kFile);
  EXPECT_EQ(given.config.training.steps, 50);
  EXPECT_EQ(given.config.training.epochs, 0);
  EXPECT_EQ(given.config.schedule.warmup_steps, 7);
  EXPECT_EQ(given.config.schedule.warmup_fraction, 0);
  EXPECT_EQ(given.config.training.seq_len, 96);
  EXPECT_TRUE(given.config.fine_tuning_defaults.empty());
  std::filesystem::remove(toml);
}

TEST(FineTuningConfig, PrintConfigShowsTheDefaultsAndReadsBack) {
  const LoadedConfig ft = load_config("", {"--model.hf=models/some-llama"});
  const std::string text = describe(ft);
  for (const char* line :
       {"\nlr = 2e-05  # fine-tuning default (model.hf set; optimizer.lr not given): ",
        "\nwarmup_fraction = 0.03  # fine-tuning default (model.hf set; schedule.warmup_fraction not given): ",
        "\nseq_len = 0  # fine-tuning default (model.hf set; training.seq_len not given): ",
        "\nepochs = 1  # fine-tuning default (model.hf set; training.epochs not given): ",
        "\n# steps: computed at launch from training.epochs: ",
        "\n# warmup_steps: computed at launch from schedule.warmup_fraction: "})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  EXPECT_EQ(text.find("\nsteps = "), std::string::npos) << text;
  EXPECT_EQ(text.find("\nwarmup_steps = "), std::string::npos) << text;

  // the output is a config that loads as it was shown (no key given twice over)
  const std::string toml =
      (std::filesystem::temp_directory_path() / fmt::format("shardtrain_ft_print_{}.toml", ::getpid())).string();
  std::ofstream(toml) << text;
  const LoadedConfig back = load_config(toml, {});
  EXPECT_DOUBLE_EQ(back.config.optimizer.lr, 2e-5);
  EXPECT_DOUBLE_EQ(back.config.schedule.warmup_fraction, 0.03);
  EXPECT_EQ(back.config.training.seq_len, 0);
  EXPECT_DOUBLE_EQ(back.config.training.epochs, 1);
  EXPECT_EQ(back.sources.at("optimizer.lr"), ValueSource::kFile);
  std::filesystem::remove(toml);
}

TEST(FineTuningConfig, KeysThatSetTheSameThingTwiceAreNamed) {
  const std::string both = error_of([] { (void)load_config("", {"--training.steps=10", "--training.epochs=2"}); });
  EXPECT_NE(both.find("`training.steps` (10, on the command line) and `training.epochs` (2, on the command line) "
                      "both set the run's length; give one of them"),
            std::string::npos)
      << both;
  const std::string toml =
      (std::filesystem::temp_directory_path() / fmt::format("shardtrain_ft_both_{}.toml", ::getpid())).string();
  std::ofstream(toml) << "[training]\nsteps = 10\n";
  const std::string file = error_of([&] { (void)load_config(toml, {"--model.hf=m", "--training.epochs=3"}); });
  EXPECT_NE(file.find("`training.steps` (10, in `" + toml + "`)"), std::string::npos) << file;
  std::filesystem::remove(toml);
  const std::string warm =
      error_of([] { (void)load_config("", {"--schedule.warmup_steps=5", "--schedule.warmup_fraction=0.1"}); });
  EXPECT_NE(warm.find("`schedule.warmup_steps` (5, on the command line) and `schedule.warmup_fraction` (0.1, on the "
                      "command line) both set the warm-up"),
            std::string::npos)
      << warm;
  const std::string eval = error_of([] { (void)load_config("", {"--eval.enabled=false", "--eval.at_start=true"}); });
  EXPECT_NE(eval.find("`eval.at_start` = true"), std::string::npos) << eval;
  EXPECT_NE(eval.find("`eval.enabled` = false"), std::string::npos) << eval;
  // steps alone with model.hf: no epochs by default, so no conflict; 0 is "unset", as a full
  // config file (print-config's) writes it beside the other key
  EXPECT_EQ(load_config("", {"--model.hf=m", "--training.steps=10"}).config.training.epochs, 0);
  EXPECT_EQ(load_config("", {"--training.steps=10", "--training.epochs=0"}).config.training.steps, 10);
  EXPECT_EQ(load_config("", {"--schedule.warmup_steps=5", "--schedule.warmup_fraction=0"}).config.schedule.warmup_steps,
            5);
}

// ---- the arithmetic ----

TEST(LaunchDefaults, EpochsAsSteps) {
  using U = data::EpochSize::Unit;
  // sequences: ceil(epochs x sequences / sequences per step)
  EXPECT_EQ(steps_for_epochs(1, {U::kSequences, 100}, 8, 64), 13);  // 12.5: the last step partial
  EXPECT_EQ(steps_for_epochs(2, {U::kSequences, 100}, 8, 64), 25);
  EXPECT_EQ(steps_for_epochs(3, {U::kSequences, 10}, 4, 64), 8);
  EXPECT_EQ(steps_for_epochs(0.1, {U::kSequences, 30}, 3, 64), 1);  // 1.0000000000000002 in doubles
  EXPECT_EQ(steps_for_epochs(0.01, {U::kSequences, 10}, 8, 64), 1);  // at least one
  // tokens: ceil(epochs x tokens / (sequences per step x seq_len))
  EXPECT_EQ(steps_for_epochs(1, {U::kTokens, 10000}, 4, 64), 40);  // 39.06
  EXPECT_EQ(steps_for_epochs(2, {U::kTokens, 2560}, 4, 64), 20);
  EXPECT_EQ(steps_for_epochs(0.5, {U::kTokens, 1000}, 1, 100), 5);
  const std::string empty = error_of([] { (void)steps_for_epochs(1, {U::kSequences, 0}, 8, 64); });
  EXPECT_NE(empty.find("`training.epochs` = 1 counts passes over the training split, which is empty"),
            std::string::npos)
      << empty;

  EXPECT_EQ(warmup_steps_for(0.03, 100), 3);
  EXPECT_EQ(warmup_steps_for(0.03, 120), 4);  // 3.6
  EXPECT_EQ(warmup_steps_for(0.03, 10), 1);
  EXPECT_EQ(warmup_steps_for(0, 100), 0);
}

TEST(LaunchDefaults, AutoSeqLen) {
  const SeqLenChoice examples = auto_seq_len(2048, 301);
  EXPECT_EQ(examples.seq_len, 320);
  EXPECT_EQ(examples.why, "the longest example, 301 tokens, rounded up to a multiple of 64; within the model's "
                          "context of 2048 tokens");
  EXPECT_EQ(auto_seq_len(2048, 320).seq_len, 320);
  EXPECT_EQ(auto_seq_len(2048).seq_len, 2048);
  const SeqLenChoice long_context = auto_seq_len(131072);
  EXPECT_EQ(long_context.seq_len, 4096);
  EXPECT_EQ(long_context.why, "the model's context of 131072 tokens, capped at 4096");
  EXPECT_EQ(auto_seq_len(256, 300).seq_len, 256);   // an example longer than the context is cut
  EXPECT_EQ(auto_seq_len(8192, 5000).seq_len, 4096);
}

// ---- held-out examples ----

// ceil(sequences / B) held-out batches; the rows of the last one past the split's end count
// nothing (targets -100), the others are the split's sequences in order.
TEST(SftHeldOut, TheLastBatchIsPartial) {
  const data::ByteTokenizer tokenizer;
  std::vector<data::SftExample> examples;
  for (int i = 0; i < 5; ++i)
    examples.push_back(data::format_prompt_response(tokenizer, fmt::format("question {} ", i), "an answer", false));
  data::SftOptions o;
  o.val_fraction = 1;  // every example held out: 5 sequences of one example each
  o.packing = false;
  o.seq_len = 32;
  const data::SftData d(examples, "five.jsonl", tokenizer, o);
  ASSERT_EQ(d.held_out_sequences().count, 5);
  const int64_t B = 4, T = 32;
  EXPECT_EQ(d.eval_batches(B, T), 2);
  EXPECT_EQ(d.eval_batches(8, T), 1);  // smaller than one batch: one partial batch
  Tensor ids = Tensor::empty({B, T}, DType::kI32), targets = Tensor::empty({B, T}, DType::kI32);
  d.fill_eval(ids, targets, 1);
  EXPECT_EQ(ids.data<int32_t>()[0], data::ByteTokenizer::kBos);  // row 0: sequence 4
  int64_t counted_row0 = 0;
  for (int64_t t = 0; t < T; ++t) counted_row0 += targets.data<int32_t>()[t] != -100;
  EXPECT_EQ(counted_row0, static_cast<int64_t>(std::string("an answer").size()) + 1);  // and EOS
  for (int64_t i = T; i < B * T; ++i) ASSERT_EQ(targets.data<int32_t>()[i], -100) << "row " << i / T;
  EXPECT_NE(error_of([&] { d.fill_eval(ids, targets, 2); }).find("past the held-out"), std::string::npos);
}

// ---- runs ----

class FineTuning : public testing::TempFolderTest {
 protected:
  // A tiny Llama as a Hugging Face folder with a context of 512 positions; no tokenizer files
  // (the jobs use the byte tokenizer).
  std::string hf_folder() {
    model::LlamaConfig c = testing::tiny_generation_config();
    c.max_seq_len = 512;
    testing::TinyStore s(c, 11);
    const std::string folder = (dir_ / "hf").string();
    testing::write_hf_folder(s, c, folder);
    return folder;
  }

  // `n` prompt/response examples of different lengths; `longest` receives the most tokens one
  // of them has as the byte tokenizer formats it.
  std::string examples(int n, int64_t* longest = nullptr, int max_extra = 90) {
    const char* animals[] = {"cat", "dog", "cow", "owl"};
    const char* colours[] = {"black", "brown", "white", "grey"};
    std::ostringstream text;
    const data::ByteTokenizer tokenizer;
    int64_t most = 0;
    for (int i = 0; i < n; ++i) {
      const std::string prompt = fmt::format("The colour of the {} number {} is ", animals[i % 4], i);
      const std::string response = std::string(colours[i % 4]) + std::string(static_cast<size_t>(i * 37 % max_extra), '!');
      text << "{\"prompt\": \"" << prompt << "\", \"response\": \"" << response << "\"}\n";
      most = std::max<int64_t>(most, static_cast<int64_t>(
                                         data::format_prompt_response(tokenizer, prompt, response, false).ids.size()));
    }
    if (longest != nullptr) *longest = most;
    return write("examples.jsonl", text.str());
  }

  // The job's base: on the CPU, the byte tokenizer, no sample, output in this test's folder.
  std::vector<std::string> base(std::vector<std::string> more) const {
    std::vector<std::string> o = {"--data.tokenizer=byte", "--training.device=cpu", "--logging.progress=off",
                                  "--sample.tokens=0", "--run.output_dir=" + (dir_ / "run").string()};
    o.insert(o.end(), more.begin(), more.end());
    return o;
  }

  // The data as the run opens it (on one rank).
  std::unique_ptr<data::TrainingData> data_of(const JobConfig& c, int64_t model_max = 512) const {
    const data::ByteTokenizer tokenizer;
    AutoSeqLen seq;
    seq.model_max_seq_len = model_max;
    return open_training_data(c, tokenizer, 300, 1, nullptr, 0, &seq);
  }

  std::vector<std::string> metrics_lines() const {
    std::ifstream in(dir_ / "run" / "metrics.jsonl");
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double peak_lr(const TrainSummary& s) {
  double peak = 0;
  for (const StepRecord& r : s.steps) peak = std::max(peak, r.lr);
  return peak;
}

// model.hf with nothing else given: lr 2e-5, 3 % warm-up, seq_len from the longest example, one
// epoch; one log line says so. Keys given win, and then the line names only the others.
TEST_F(FineTuning, DefaultsAndTheirLogLine) {
  const std::string hf = hf_folder();
  int64_t longest = 0;
  const std::string jsonl = examples(60, &longest);
  const int64_t expected_seq_len = ceil_div(longest, 64) * 64;
  ASSERT_LT(expected_seq_len, 512) << "the examples must be shorter than the model's context";
  const JobConfig c = load_config("", base({"--model.hf=" + hf, "--data.source=" + jsonl, "--data.format=sft",
                                            "--training.batch_size=4", "--eval.interval_steps=0"}))
                          .config;
  auto data = data_of(c);
  const int64_t sequences = data->epoch_size()->count;
  const int64_t steps = ceil_div(sequences, 4);

  ::testing::internal::CaptureStderr();
  const TrainSummary s = Trainer(c).run();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(static_cast<int64_t>(s.steps.size()), steps);
  EXPECT_DOUBLE_EQ(peak_lr(s), 2e-5);
  const int64_t warmup = static_cast<int64_t>(std::ceil(0.03 * static_cast<double>(steps)));
  EXPECT_DOUBLE_EQ(s.steps.front().lr, 2e-5 / static_cast<double>(warmup));
  const std::string line = fmt::format(
      "fine-tuning defaults (model.hf set; keys given in a config file or on the command line win): lr 2e-05 "
      "(optimizer.lr not given), warm-up 3 % of the steps = {} step{} (schedule.warmup_steps not given), seq_len {} "
      "(the longest example, {} tokens, rounded up to a multiple of 64; within the model's context of 512 tokens; "
      "training.seq_len not given), 1 epoch = {} steps ({} training sequences, 4 per step; a partial last step is "
      "filled from the start of the next epoch's order; training.steps not given)",
      warmup, warmup == 1 ? "" : "s", expected_seq_len, longest, steps, sequences);
  EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  EXPECT_NE(log.find(fmt::format("x {} tokens", expected_seq_len)), std::string::npos) << "the step line: " << log;

  // given keys win; the line names what is left
  const JobConfig given = load_config("", base({"--model.hf=" + hf, "--data.source=" + jsonl, "--data.format=sft",
                                                "--training.batch_size=4", "--optimizer.lr=1e-3",
                                                "--training.steps=3", "--training.seq_len=192"}))
                              .config;
  ::testing::internal::CaptureStderr();
  const TrainSummary g = Trainer(given).run();
  const std::string given_log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(g.steps.size(), 3u);
  EXPECT_DOUBLE_EQ(peak_lr(g), 1e-3);
  EXPECT_NE(given_log.find("fine-tuning defaults (model.hf set; keys given in a config file or on the command line "
                           "win): warm-up 3 % of the steps = 1 step (schedule.warmup_steps not given)\n"),
            std::string::npos)
      << given_log;

  // without model.hf, none
  const JobConfig scratch =
      load_config("", base({"--model.dim=32", "--model.n_layers=1", "--model.ffn_dim=40", "--training.steps=2",
                            "--training.seq_len=64", "--schedule.warmup_steps=1", "--data.source=" + jsonl,
                            "--data.format=sft"}))
          .config;
  ::testing::internal::CaptureStderr();
  const TrainSummary n = Trainer(scratch).run();
  const std::string scratch_log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(n.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(peak_lr(n), 2e-3);
  EXPECT_EQ(scratch_log.find("fine-tuning defaults"), std::string::npos) << scratch_log;
}

// training.epochs over examples: ceil(epochs x training sequences / sequences per step (batch x
// accumulation x ranks)).
TEST_F(FineTuning, EpochsOfExamples) {
  const std::string hf = hf_folder();
  const JobConfig c = load_config("", base({"--model.hf=" + hf, "--data.source=" + examples(50), "--data.format=sft",
                                            "--data.packing=false", "--data.val_fraction=0.1", "--training.batch_size=3",
                                            "--training.grad_accum_steps=2", "--training.epochs=2",
                                            "--training.seq_len=128", "--eval.interval_steps=0"}))
                          .config;
  const int64_t sequences = data_of(c)->epoch_size()->count;
  ASSERT_GT(sequences, 40);  // one example each, less the held-out ones
  const int64_t steps = ceil_div(2 * sequences, 6);
  ::testing::internal::CaptureStderr();
  const TrainSummary s = Trainer(c).run();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(static_cast<int64_t>(s.steps.size()), steps);
  const std::string line = fmt::format("training.epochs = 2: {} steps ({} training sequences, 6 per step; a partial "
                                       "last step is filled from the start of the next epoch's order)",
                                       steps, sequences);
  EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
}

// training.epochs over a token stream: ceil(epochs x training tokens / tokens per step), at the
// sequence length chosen from the model's context (documents are not measured).
TEST_F(FineTuning, EpochsOfTokens) {
  const std::string hf = hf_folder();
  std::string corpus;
  for (int i = 0; i < 300; ++i)
    corpus += fmt::format("Document {} tells of the {} river and its {} stones.\n\n", i, i % 3 ? "slow" : "quick",
                          i * 7 % 23);
  const std::string text = write("corpus.txt", corpus);
  const JobConfig c = load_config("", base({"--model.hf=" + hf, "--data.source=" + text, "--training.batch_size=2",
                                            "--training.epochs=0.5", "--data.val_fraction=0.3",
                                            "--eval.batches=1"}))
                          .config;
  const data::EpochSize size = *data_of(c)->epoch_size();
  ASSERT_EQ(size.unit, data::EpochSize::Unit::kTokens);
  const int64_t steps = static_cast<int64_t>(std::ceil(0.5 * static_cast<double>(size.count) / (2 * 512)));
  ASSERT_GE(steps, 2);
  ::testing::internal::CaptureStderr();
  const TrainSummary s = Trainer(c).run();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(static_cast<int64_t>(s.steps.size()), steps);
  const std::string line = fmt::format("training.epochs = 0.5: {} steps ({} training tokens, 1024 per step, in "
                                       "random windows)",
                                       steps, size.count);
  EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  EXPECT_NE(log.find("seq_len 512 (the model's context of 512 tokens; training.seq_len not given)"),
            std::string::npos)
      << log;
}

TEST_F(FineTuning, EpochsOfRandomTokensAreAnError) {
  const std::string hf = hf_folder();
  const JobConfig c = load_config("", base({"--model.hf=" + hf, "--data.source=builtin:random"})).config;
  const std::string e = error_of([&] { Trainer t(c); });
  EXPECT_NE(e.find("`training.epochs` = 1 counts passes over the training data, but `data.source` = "
                   "`builtin:random` is random tokens, of no size; set `training.steps` instead"),
            std::string::npos)
      << e;
}

// A held-out split smaller than one batch: training starts, and each evaluation covers it whole,
// its loss the mean over its counted tokens (as one sequence per batch gives it).
TEST_F(FineTuning, HeldOutSmallerThanOneBatchIsEvaluatedWhole) {
  const std::string hf = hf_folder();
  const std::vector<std::string> job = {"--model.hf=" + hf, "--data.source=" + examples(60), "--data.format=sft",
                                        "--data.packing=false", "--data.val_fraction=0.1", "--training.seq_len=128",
                                        "--training.steps=2", "--schedule.warmup_steps=1",
                                        "--eval.interval_steps=1", "--eval.batches=0"};
  JobConfig c = load_config("", base(job)).config;
  c.training.batch_size = 8;
  const std::unique_ptr<data::TrainingData> data = data_of(c);
  const auto* sft = dynamic_cast<const data::SftData*>(data.get());
  ASSERT_NE(sft, nullptr);
  const int64_t held_out = sft->held_out_sequences().count;
  ASSERT_GT(held_out, 1);
  ASSERT_LT(held_out, 8) << "the held-out split must be smaller than one batch";

  const TrainSummary s = Trainer(c).run();
  ASSERT_EQ(s.evals.size(), 2u);
  EXPECT_TRUE(std::isfinite(s.evals.back().second));
  int eval_lines = 0;
  for (const std::string& line : metrics_lines()) eval_lines += line.find("\"eval_loss\"") != std::string::npos;
  EXPECT_EQ(eval_lines, 2);

  // by tokens: the partial batch of 8 rows gives what batches of one sequence each give
  JobConfig one = c;
  one.training.batch_size = 1;
  const double partial = Trainer(c).evaluate().loss;
  const double whole = Trainer(one).evaluate().loss;
  EXPECT_NEAR(partial, whole, 1e-5 * std::abs(whole)) << "held-out sequences " << held_out;
}

// eval.enabled = false: no evaluation at all, so no held-out data is needed and metrics.jsonl
// has no eval lines. Fine-tuning with eval.enabled not given does the same where the held-out
// split is empty (a small set's share rounds to no example); given as true, it is an error.
TEST_F(FineTuning, EvaluationOff) {
  const std::string hf = hf_folder();
  const std::vector<std::string> job = {"--model.hf=" + hf, "--data.source=" + examples(20), "--data.format=sft",
                                        "--data.val_fraction=0", "--training.seq_len=128", "--training.steps=3",
                                        "--training.batch_size=2", "--eval.interval_steps=1"};
  std::vector<std::string> on = job;
  on.push_back("--eval.enabled=true");
  const std::string needs = error_of([&] { Trainer t(load_config("", base(on)).config); });
  EXPECT_NE(needs.find("or set `eval.enabled` = false"), std::string::npos) << needs;

  std::vector<std::string> off = job;
  off.push_back("--eval.enabled=false");
  for (const std::vector<std::string>& args : {off, job}) {
    const TrainSummary s = Trainer(load_config("", base(args)).config).run();
    EXPECT_EQ(s.steps.size(), 3u);
    EXPECT_TRUE(s.evals.empty());
    const std::vector<std::string> lines = metrics_lines();
    EXPECT_EQ(lines.size(), 3u);
    for (const std::string& line : lines) EXPECT_EQ(line.find("eval_loss"), std::string::npos) << line;
    std::filesystem::remove_all(dir_ / "run");
  }
}

// model.extend_context trains a folder past its own context (512 positions here) and exports the
// longer context; model.rope_theta_scale scales its rotary base, which the loss shows and the
// export records. Without the key, or with a shorter context, the job stops before any work.
TEST_F(FineTuning, ExtendedContextTrainsPastTheModelsOwnAndExportsIt) {
  const std::string hf = hf_folder();
  std::string text;
  for (int i = 0; text.size() < 24000; ++i) text += fmt::format("line {} of a long document, {}\n", i, i * 7919 % 1000);
  const std::vector<std::string> job = {"--model.hf=" + hf, "--data.source=" + write("long.txt", text),
                                        "--training.seq_len=1024", "--training.steps=2", "--training.batch_size=1",
                                        "--eval.enabled=false", "--optimizer.lr=1e-3"};
  const std::string refused = error_of([&] { Trainer t(load_config("", base(job)).config); });
  EXPECT_NE(refused.find("exceeds the max_position_embeddings (512) of `model.hf`"), std::string::npos) << refused;
  EXPECT_NE(refused.find("`model.extend_context`"), std::string::npos) << refused;

  std::vector<std::string> shorter = job;
  shorter.push_back("--model.extend_context=256");
  const std::string short_error = error_of([&] { Trainer t(load_config("", base(shorter)).config); });
  EXPECT_NE(short_error.find("is shorter than `model.hf`"), std::string::npos) << short_error;

  auto run = [&](double theta_scale) {
    std::vector<std::string> args = job;
    args.push_back("--model.extend_context=1024");
    args.push_back(fmt::format("--model.rope_theta_scale={}", theta_scale));
    args.push_back("--export.folder=" + (dir_ / "export").string());
    const TrainSummary s = Trainer(load_config("", base(args)).config).run();
    std::ifstream in(dir_ / "export" / "config.json");
    const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::filesystem::remove_all(dir_ / "run");
    std::filesystem::remove_all(dir_ / "export");
    return std::pair(s, config);
  };
  const auto [plain, plain_config] = run(1.0);
  const auto [scaled, scaled_config] = run(4.0);
  ASSERT_EQ(plain.steps.size(), 2u);
  ASSERT_EQ(scaled.steps.size(), 2u);
  EXPECT_NE(plain_config.find("\"max_position_embeddings\": 1024"), std::string::npos) << plain_config;
  EXPECT_NE(plain_config.find("\"rope_theta\": 10000.0"), std::string::npos) << plain_config;
  EXPECT_NE(scaled_config.find("\"rope_theta\": 40000.0"), std::string::npos) << scaled_config;
  // the same weights and tokens: a slower rotation changes every attention score past position 0
  EXPECT_NE(plain.steps.front().loss, scaled.steps.front().loss);
}

}  // namespace
}  // namespace shardtrain::train
