// Checkpoints on one rank: resuming equals training straight through (bitwise, f32),
// `latest` and `keep` behave, a damaged checkpoint gives a named error, and `export`
// writes exactly the trained weights. (Across rank counts: tests/fsdp, under mpirun.)
#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/build_info.h"
#include "io/checksum.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "testing/compare.h"
#include "train/export.h"
#include "train/inspect.h"
#include "train/trainer.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("shardtrain_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string corpus(const std::string& dir) {
  const std::string path = dir + "/corpus.txt";
  std::ofstream out(path);
  for (int i = 0; i < 200; ++i) out << "Checkpoint " << i << " keeps the weights and the moments " << i % 7 << ".\n\n";
  return path;
}

JobConfig job(const std::string& dir) {
  LoadedConfig c = load_config(
      "", {"--model.dim=40", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2", "--model.ffn_dim=52",
           "--model.max_seq_len=32", "--training.seq_len=24", "--training.batch_size=3", "--training.steps=6",
           "--training.device=cpu", "--schedule.warmup_steps=2", "--optimizer.lr=3e-3", "--eval.interval_steps=0",
           "--eval.batches=1", "--sample.tokens=0", "--logging.progress=off", "--logging.level=warn",
           "--logging.metrics_file=", "--checkpoint.interval_steps=3", "--data.source=" + corpus(dir),
           "--data.val_fraction=0.1", "--run.output_dir=" + dir});
  return c.config;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void expect_same_masters(Trainer& a, Trainer& b) {
  for (size_t u = 0; u < a.store().master_shards().size(); ++u)
    EXPECT_TRUE(testing::all_close(a.store().master_shards()[u], b.store().master_shards()[u], testing::kExact))
        << "unit " << u;
}

// Trains `c` for its 6 steps, then again from step 3's checkpoint: the same losses, gradient
// norms and weights.
void expect_resume_equals_straight_through(const JobConfig& c0, const std::string& dir) {
  Trainer straight(c0);
  const TrainSummary a = straight.run();
  ASSERT_EQ(a.steps.size(), 6u);
  EXPECT_TRUE(fs::is_directory(dir + "/checkpoints/step_00000003"));
  EXPECT_TRUE(fs::is_directory(dir + "/checkpoints/step_00000006"));
  EXPECT_EQ(resolve_checkpoint("auto", dir + "/checkpoints"), dir + "/checkpoints/step_00000006");

  // as if the job had been killed after step 3's checkpoint
  JobConfig c = c0;
  c.checkpoint.interval_steps = 0;
  c.checkpoint.resume = dir + "/checkpoints/step_00000003";
  Trainer resumed(c);
  const TrainSummary b = resumed.run();
  ASSERT_EQ(b.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b.steps[i].step, a.steps[i + 3].step);
    EXPECT_EQ(b.steps[i].loss, a.steps[i + 3].loss) << "step " << b.steps[i].step;
    EXPECT_EQ(b.steps[i].grad_norm, a.steps[i + 3].grad_norm) << "step " << b.steps[i].step;
  }
  expect_same_masters(straight, resumed);
  EXPECT_EQ(resumed.optimizer().steps_taken(), 6);
}

TEST(Checkpoint, ResumeEqualsStraightThrough) {
  const std::string dir = fresh_dir("resume");
  expect_resume_equals_straight_through(job(dir), dir);
}

// The same for fine-tuning examples (their epochs' order is a function of the step alone),
// with two micro-batches a step.
TEST(Checkpoint, ResumeEqualsStraightThroughOnFineTuningExamples) {
  const std::string dir = fresh_dir("resume_sft");
  const std::string path = dir + "/examples.jsonl";
  {
    std::ofstream out(path);
    for (int i = 0; i < 60; ++i)
      out << "{\"prompt\": \"Q" << i << ": \", \"response\": \"A" << i % 5 << " and " << i << ".\"}\n";
  }
  JobConfig c = job(dir);
  c.data.source = path;
  c.data.format = "sft";
  c.training.grad_accum_steps = 2;
  expect_resume_equals_straight_through(c, dir);
}

// Heads of a width of their own (model.head_dim = 16: 4 x 16 = 64 wide attention in a
// 40-wide model): training, resuming (bitwise the straight run), exporting a Hugging Face
// folder whose config.json carries head_dim and whose projections have the decoupled shapes,
// and fine-tuning from that folder, which loads exactly the trained weights.
TEST(Checkpoint, ADecoupledHeadDimTrainsResumesExportsAndReloads) {
  const std::string dir = fresh_dir("head_dim");
  JobConfig c = job(dir);
  c.model.head_dim = 16;
  expect_resume_equals_straight_through(c, dir);

  const std::string out = fresh_dir("head_dim_export");
  JobConfig c2 = job(out);
  c2.model.head_dim = 16;
  Trainer straight(c2);  // the same run again in a folder of its own, to keep its weights
  straight.run();
  const model::LlamaConfig& mc = straight.model().config();
  EXPECT_EQ(mc.head_dim(), 16);
  EXPECT_EQ(mc.q_dim(), 64);
  EXPECT_EQ(straight.store().layout().locate("model.layers.0.self_attn.o_proj.weight").spec->shape, Shape({40, 64}));

  ExportOptions o;
  o.folder = out + "/hf";
  o.dtype = DType::kF32;
  export_checkpoint(out + "/checkpoints", o);
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(o.folder + "/config.json"));
  EXPECT_EQ(config.at("head_dim"), 16);
  EXPECT_EQ(config.at("hidden_size"), 40);
  EXPECT_EQ(config.at("num_attention_heads"), 4);
  const io::HfWeights w(o.folder);
  EXPECT_EQ(w.get("model.layers.1.self_attn.q_proj.weight").shape, std::vector<int64_t>({64, 40}));
  EXPECT_EQ(w.get("model.layers.1.self_attn.k_proj.weight").shape, std::vector<int64_t>({32, 40}));
  EXPECT_EQ(w.get("model.layers.1.self_attn.v_proj.weight").shape, std::vector<int64_t>({32, 40}));
  EXPECT_EQ(w.get("model.layers.1.self_attn.o_proj.weight").shape, std::vector<int64_t>({40, 64}));
  const std::string report = inspect_report(o.folder).text;
  EXPECT_NE(report.find("(head dim 16, decoupled: attention width 4 x 16 = 64)"), std::string::npos) << report;

  // fine-tuning the export: its config.json gives the shape, its weights the trained ones
  JobConfig tune = c2;
  tune.model.head_dim = 0;  // the shape keys give way to model.hf's config.json
  tune.model.hf = o.folder;
  tune.run.output_dir = out + "/tune";
  tune.checkpoint.interval_steps = 0;
  tune.training.steps = 2;
  Trainer tuned(tune);
  EXPECT_EQ(tuned.model().config().head_dim(), 16);
  expect_same_masters(straight, tuned);
  const TrainSummary t = tuned.run();
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_TRUE(std::isfinite(t.steps.back().loss));
}

// A partial rotary (model.rotary_fraction = 0.8: rope on 8 of each head's 10 dims, as
// Phi-4-mini's 0.75): training and resuming (bitwise the straight run), an export as Hugging
// Face's phi3 (partial_rotary_factor; q, k, v in qkv_proj and gate, up in gate_up_proj) that
// inspect reads, and fine-tuning from it, which loads exactly the trained weights.
TEST(Checkpoint, APartialRotaryTrainsResumesExportsAsPhi3AndReloads) {
  const std::string dir = fresh_dir("rotary_fraction");
  JobConfig c = job(dir);
  c.model.rotary_fraction = 0.8;
  expect_resume_equals_straight_through(c, dir);

  const std::string out = fresh_dir("rotary_fraction_export");
  JobConfig c2 = job(out);
  c2.model.rotary_fraction = 0.8;
  Trainer straight(c2);
  straight.run();
  EXPECT_EQ(straight.model().config().rotary_dim(), 8);
  ExportOptions o;
  o.folder = out + "/hf";
  o.dtype = DType::kF32;
  export_checkpoint(out + "/checkpoints", o);
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(o.folder + "/config.json"));
  EXPECT_EQ(config.at("model_type"), "phi3");
  EXPECT_EQ(config.at("partial_rotary_factor"), 0.8);
  const io::HfWeights w(o.folder);
  EXPECT_EQ(w.get("model.layers.1.self_attn.qkv_proj.weight").shape, std::vector<int64_t>({40 + 2 * 20, 40}));
  EXPECT_EQ(w.get("model.layers.1.mlp.gate_up_proj.weight").shape, std::vector<int64_t>({2 * 52, 40}));
  EXPECT_EQ(w.find("model.layers.1.self_attn.q_proj.weight"), nullptr);
  const InspectReport report = inspect_report(o.folder);
  EXPECT_EQ(report.problems, 0) << report.text;
  EXPECT_NE(report.text.find("partial rotary: rope on the first 8 of each head's 10 dims"), std::string::npos)
      << report.text;

  JobConfig tune = c2;
  tune.model.rotary_fraction = 1.0;  // the shape keys give way to model.hf's config.json
  tune.model.hf = o.folder;
  tune.run.output_dir = out + "/tune";
  tune.checkpoint.interval_steps = 0;
  tune.training.steps = 2;
  Trainer tuned(tune);
  EXPECT_EQ(tuned.model().config().rotary_dim(), 8);
  expect_same_masters(straight, tuned);
  const TrainSummary t = tuned.run();
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_TRUE(std::isfinite(t.steps.back().loss));
}

// checkpoint.async: the files written on a thread while training goes on are the synchronous
// run's byte for byte, and resuming from them equals training straight through.
TEST(Checkpoint, AsyncSavesTheSameFilesAndResumes) {
  const std::string sync_dir = fresh_dir("sync");
  Trainer(job(sync_dir)).run();
  const std::string dir = fresh_dir("async");
  JobConfig c = job(dir);
  c.checkpoint.async = true;
  expect_resume_equals_straight_through(c, dir);
  for (const char* step : {"step_00000003", "step_00000006"}) {
    for (const char* file : {"rank_00000-of-00001.safetensors", "metadata.json"}) {
      std::ifstream a(sync_dir + "/checkpoints/" + step + "/" + file, std::ios::binary);
      std::ifstream b(dir + "/checkpoints/" + step + "/" + file, std::ios::binary);
      const std::string sa((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
      const std::string sb((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
      EXPECT_FALSE(sa.empty());
      EXPECT_TRUE(sa == sb) << step << "/" << file << " differs from the synchronous save";
    }
  }
}

// A rank whose file cannot be written fails the commit on every rank, and `latest` keeps
// naming the previous checkpoint.
TEST(Checkpoint, AFailedWriteIsNotCommitted) {
  const std::string dir = fresh_dir("failed_write");
  JobConfig c = job(dir);
  c.training.steps = 3;
  Trainer t(c);
  t.run();
  const std::string root = dir + "/checkpoints";
  ASSERT_EQ(resolve_checkpoint("auto", root), root + "/step_00000003");
  const std::unique_ptr<dist::Communicator> one = dist::make_single_rank();
  dist::Communicator& comm = *one;
  std::unique_ptr<PendingCheckpoint> p =
      begin_checkpoint(root, 4, t.model().config(), "", t.store(), &t.optimizer(), comm, 0);
  // the temporary directory replaced by a file: the rank file cannot be created
  fs::remove_all(root + "/.step_00000004.tmp");
  std::ofstream(root + "/.step_00000004.tmp") << "in the way";
  std::exception_ptr write_error;
  try {
    p->write();
  } catch (const Error&) {
    write_error = std::current_exception();
  }
  ASSERT_TRUE(write_error) << "the write must fail";
  const std::string e = error_of([&] { p->commit(comm, write_error); });
  EXPECT_NE(e.find("1 of 1 ranks failed to write their file"), std::string::npos) << e;
  EXPECT_NE(e.find("(this rank: "), std::string::npos) << e << ": the rank's own error is named";
  EXPECT_EQ(resolve_checkpoint("auto", root), root + "/step_00000003");
  EXPECT_FALSE(fs::exists(root + "/step_00000004"));

  // this rank's file written, then the save failing (as another rank's disk full would): the
  // written file goes with the temporary directory
  p = begin_checkpoint(root, 5, t.model().config(), "", t.store(), &t.optimizer(), comm, 0);
  p->write();
  ASSERT_TRUE(fs::exists(root + "/.step_00000005.tmp/rank_00000-of-00001.safetensors"));
  const std::string full = error_of([&] { p->commit(comm, std::make_exception_ptr(Error("No space left on device"))); });
  EXPECT_NE(full.find("No space left on device"), std::string::npos) << full;
  EXPECT_FALSE(fs::exists(root + "/.step_00000005.tmp")) << "a failed save removes its partial files";
  EXPECT_EQ(resolve_checkpoint("auto", root), root + "/step_00000003");
}

// What killed saves and exports left (a step's temporary directory, `latest` or a shard under a
// temporary name, an export's partial shard) is removed by the next run that uses the folders,
// before any save of its own; everything else stays.
TEST(Checkpoint, TheNextRunRemovesWhatInterruptedSavesLeft) {
  const std::string dir = fresh_dir("leftovers");
  JobConfig c = job(dir);
  c.training.steps = 3;
  Trainer(c).run();
  const std::string root = dir + "/checkpoints", out = dir + "/hf";
  fs::create_directories(root + "/.step_00000009.tmp");
  std::ofstream(root + "/.step_00000009.tmp/rank_00000-of-00001.safetensors") << "partial";
  std::ofstream(root + "/latest.tmp.4242") << "step_00000009\n";
  fs::create_directories(out);
  std::ofstream(out + "/shard-0.partial.safetensors") << "partial";
  std::ofstream(out + "/shard-1.partial.safetensors.tmp.4242") << "partial";
  std::ofstream(out + "/config.json.tmp.77") << "{";
  std::ofstream(root + "/notes.tmp") << "the user's";
  fs::create_directories(out + ".tmp.4242");  // an export killed while writing its staging folder
  std::ofstream(out + ".tmp.4242/model.safetensors") << "partial";
  std::ofstream(root + "/README") << "the user's";
  JobConfig r = c;
  r.checkpoint.resume = "auto";
  r.training.steps = 4;
  r.export_.folder = out;
  Trainer t(r);  // removed at launch, before the first step
  for (const std::string& gone : {root + "/.step_00000009.tmp", root + "/latest.tmp.4242",
                                 out + "/shard-0.partial.safetensors", out + "/shard-1.partial.safetensors.tmp.4242",
                                 out + "/config.json.tmp.77", out + ".tmp.4242"})
    EXPECT_FALSE(fs::exists(gone)) << gone;
  for (const std::string& kept : {root + "/step_00000003", root + "/latest", root + "/notes.tmp", root + "/README"})
    EXPECT_TRUE(fs::exists(kept)) << kept;
  ASSERT_EQ(t.run().steps.size(), 1u);
  EXPECT_TRUE(fs::exists(out + "/config.json"));
}

// Every folder the run writes is created and probed at launch: one that cannot be written
// fails before the first step, naming its key, not at the first save or the export after the
// whole run. (A path under a regular file cannot be created, even by root.)
TEST(Checkpoint, AnUnwritableFolderFailsAtLaunchNamingItsKey) {
  const std::string dir = fresh_dir("unwritable");
  const std::string file = dir + "/a_file";
  std::ofstream(file) << "not a folder";
  const std::string bad = file + "/sub";
  const std::vector<std::pair<std::string, std::function<void(JobConfig&)>>> cases = {
      {"checkpoint.dir", [&](JobConfig& c) { c.checkpoint.dir = bad; }},
      {"export.folder", [&](JobConfig& c) { c.export_.folder = bad; }},
      {"run.output_dir", [&](JobConfig& c) { c.run.output_dir = bad; }},
      {"logging.tensorboard_dir", [&](JobConfig& c) { c.logging.tensorboard_dir = bad; }},
      {"logging.metrics_file", [&](JobConfig& c) { c.logging.metrics_file = bad + "/metrics.jsonl"; }},
  };
  for (const auto& [key, edit] : cases) {
    JobConfig c = job(dir);
    edit(c);
    const std::string e = error_of([&] { Trainer t(c); });
    EXPECT_NE(e.find("`" + key + "` = \"" + bad + "\" is not writable: the folder cannot be created"),
              std::string::npos) << key << ": " << e;
  }
  // the probe leaves nothing behind; the export folder, swapped in whole at the end, is not made
  JobConfig c = job(dir);
  c.export_.folder = dir + "/out/export";
  Trainer t(c);
  EXPECT_TRUE(fs::is_directory(dir + "/out"));
  EXPECT_TRUE(fs::is_empty(dir + "/out"));
  // a folder holding files an export does not write fails at launch, naming the file
  fs::create_directories(dir + "/mine");
  std::ofstream(dir + "/mine/notes.txt") << "the user's";
  c.export_.folder = dir + "/mine";
  const std::string e = error_of([&] { Trainer t2(c); });
  EXPECT_NE(e.find("`export.folder` = \"" + dir + "/mine\" holds `notes.txt`, which an export does not write"),
            std::string::npos) << e;
  EXPECT_TRUE(fs::exists(dir + "/mine/notes.txt"));
}

TEST(Checkpoint, AutoResumesTheLatestAndKeepDeletesOlder) {
  const std::string dir = fresh_dir("auto");
  JobConfig c = job(dir);
  c.checkpoint.keep = 1;
  c.training.steps = 4;
  c.checkpoint.interval_steps = 2;
  c.logging.metrics_file = "metrics.jsonl";
  Trainer(c).run();
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step_00000002")) << "keep = 1";
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_00000004"));
  // a temporary directory left by a crash is not a checkpoint
  fs::create_directories(dir + "/checkpoints/.step_00000009.tmp");
  c.training.steps = 5;
  c.checkpoint.resume = "auto";
  c.logging.tensorboard_dir = "tb";
  Trainer t(c);
  const TrainSummary s = t.run();
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_EQ(s.steps.front().step, 5);
  // the metrics file keeps the first run's steps and continues; the resumed run's TensorBoard
  // file is its own
  std::vector<int64_t> loss_steps, eval_steps;
  std::ifstream metrics(c.run.output_dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) loss_steps.push_back(j["step"]);
    if (j.contains("eval_loss")) eval_steps.push_back(j["step"]);
  }
  EXPECT_EQ(loss_steps, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{4, 5}));
  ASSERT_TRUE(fs::is_directory(c.run.output_dir + "/tb"));
  EXPECT_EQ(std::distance(fs::directory_iterator(c.run.output_dir + "/tb"), fs::directory_iterator()), 1);

  // every step done already: nothing trained, nothing written, no error
  {
    const auto latest_time = fs::last_write_time(dir + "/checkpoints/latest");
    JobConfig done = c;
    done.logging.tensorboard_dir.clear();
    Trainer finished(done);
    const TrainSummary f = finished.run();
    EXPECT_EQ(f.already_complete_at, 5);
    EXPECT_TRUE(f.steps.empty());
    EXPECT_TRUE(f.evals.empty());
    EXPECT_TRUE(fs::last_write_time(dir + "/checkpoints/latest") == latest_time);
    done.training.steps = 4;  // fewer steps than the checkpoint's: complete too
    EXPECT_EQ(Trainer(done).run().already_complete_at, 5);
  }

  // nothing to resume from: a fresh start, said in the log
  JobConfig fresh = job(fresh_dir("auto_empty"));
  fresh.checkpoint.resume = "auto";
  fresh.training.steps = 1;
  EXPECT_EQ(Trainer(fresh).run().steps.size(), 1u);
}


// An update that leaves NaN or inf in the weights or AdamW's state ends the run before its
// checkpoint: `latest` stays the good one, and keep = 1 does not delete it. Two ways in: a
// learning rate past f32's range, and one corrupted element of the second moment (the weights
// stay finite then: m / inf = 0).
void expect_nonfinite_update_not_saved(const std::string& name, const std::function<void(JobConfig&)>& change,
                                       const std::function<void(Trainer&, int64_t step)>& hook, int64_t bad_step,
                                       const std::string& found) {
  const std::string dir = fresh_dir(name);
  JobConfig c = job(dir);
  c.checkpoint.keep = 1;
  c.training.steps = 3;
  Trainer(c).run();
  const std::string good = dir + "/checkpoints/step_00000003";
  ASSERT_EQ(resolve_checkpoint("auto", dir + "/checkpoints"), good);
  c.training.steps = 6;
  c.checkpoint.resume = "auto";
  change(c);
  Trainer t(c);
  t.set_after_backward([&](int64_t step) { hook(t, step); });
  const std::string e = error_of([&] { t.run(); });
  EXPECT_NE(e.find("step " + std::to_string(bad_step) + ": the AdamW update left NaN or inf in `"), std::string::npos)
      << e;
  EXPECT_NE(e.find(found), std::string::npos) << e;
  EXPECT_NE(e.find("stopped before saving it"), std::string::npos) << e;
  EXPECT_EQ(resolve_checkpoint("auto", dir + "/checkpoints"), good);
  EXPECT_TRUE(fs::is_directory(good));
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step_00000006"));
  // the good checkpoint still resumes
  JobConfig again = job(dir);
  again.training.steps = 4;
  again.checkpoint.resume = "auto";
  again.checkpoint.interval_steps = 0;
  EXPECT_EQ(Trainer(again).run().steps.size(), 1u);
}

TEST(Checkpoint, AnUpdatePastF32RangeIsNotSaved) {
  expect_nonfinite_update_not_saved(
      "huge_lr", [](JobConfig& c) { c.optimizer.lr = 1e39; }, [](Trainer&, int64_t) {}, 4, "(weights");
}

TEST(Checkpoint, ACorruptedSecondMomentIsNotSaved) {
  expect_nonfinite_update_not_saved(
      "corrupt_v", [](JobConfig&) {},
      [](Trainer& t, int64_t step) {
        if (step == 5) t.optimizer().exp_avg_sq()[1].data<float>()[0] = std::numeric_limits<float>::infinity();
      },
      5, "(exp_avg_sq)");
}

// Makes element `element` of the first tensor in `file` whose name contains `part` a NaN, in
// place; returns that tensor's name.
std::string poison_element(const std::string& file, const std::string& part, int64_t element) {
  std::string name;
  int64_t at = 0;
  std::string dtype;
  {
    const io::SafetensorsFile f(file);
    for (const io::TensorInfo& t : f.tensors())
      if (t.name.find(part) != std::string::npos && element < t.numel) {
        name = t.name;
        dtype = t.dtype;
        at = t.begin + element * static_cast<int64_t>(t.element_size);
        break;
      }
  }
  EXPECT_FALSE(name.empty()) << "no tensor with `" << part << "` in " << file;
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  io.read(reinterpret_cast<char*>(&header), 8);  // little-endian length
  io.seekp(static_cast<std::streamoff>(8 + header + static_cast<uint64_t>(at)));
  const uint32_t nan_f32 = 0x7fc00000u;
  const uint16_t nan_bf16 = 0x7fc0u;
  if (dtype == "F32")
    io.write(reinterpret_cast<const char*>(&nan_f32), 4);
  else
    io.write(reinterpret_cast<const char*>(&nan_bf16), 2);
  return name;
}

// Writes the checksum of tensor `name`'s bytes as they are now into `file`'s header (8 hex
// digits in place of 8): a file whose damage came with a matching checksum, as a writer
// without the save guard would leave it.
void reseal_checksum(const std::string& file, const std::string& name) {
  std::string old_sum, new_sum;
  {
    const io::SafetensorsFile f(file);
    ASSERT_TRUE(f.has_checksums());
    old_sum = io::format_crc32c(*f.stored_checksum(name));
    new_sum = io::format_crc32c(f.computed_checksum(name));
  }
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  io.read(reinterpret_cast<char*>(&header), 8);
  std::string text(header, '\0');
  io.read(text.data(), static_cast<std::streamsize>(header));
  // the entry is `\"<name>\":\"<8 hex>\"` inside the metadata's JSON string
  const std::string key = "\\\"" + name + "\\\":\\\"" + old_sum;
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << key;
  io.seekp(static_cast<std::streamoff>(8 + at + key.size() - 8));
  io.write(new_sum.data(), 8);
}

// A run killed after its last save but before its export finished is resumed as complete; its
// export is then written from the last checkpoint, the same bytes as the end of training
// writes. An export newer than that checkpoint is left as it is.
TEST(Checkpoint, AFinishedRunsMissingExportIsWrittenOnResume) {
  const std::string dir = fresh_dir("finished_export");
  JobConfig c = job(dir);
  c.training.steps = 3;
  c.export_.folder = dir + "/hf";
  c.export_.dtype = "f32";
  Trainer(c).run();
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string weights = bytes(dir + "/hf/model.safetensors"), config = bytes(dir + "/hf/config.json");
  JobConfig r = c;
  r.checkpoint.resume = "auto";
  const auto written = fs::last_write_time(dir + "/hf/model.safetensors");
  EXPECT_EQ(Trainer(r).run().already_complete_at, 3);
  EXPECT_EQ(fs::last_write_time(dir + "/hf/model.safetensors"), written);  // current: not written again

  fs::remove_all(dir + "/hf");
  EXPECT_EQ(Trainer(r).run().already_complete_at, 3);
  ASSERT_TRUE(fs::exists(dir + "/hf/model.safetensors"));
  EXPECT_TRUE(bytes(dir + "/hf/model.safetensors") == weights);
  EXPECT_EQ(bytes(dir + "/hf/config.json"), config);
}

// One flipped bit in a checkpoint's tensor data, or in an exported folder's weights, is an
// error at load naming the file and the tensor (before a step is trained on different
// numbers); `inspect --verify` names it too and counts it as a problem.
TEST(Checkpoint, AFlippedBitFailsAtLoadNamingFileAndTensor) {
  const std::string dir = fresh_dir("flipped");
  JobConfig c = job(dir);
  c.training.steps = 3;
  c.export_.folder = dir + "/hf";
  Trainer(c).run();
  const std::string file = dir + "/checkpoints/step_00000003/rank_00000-of-00001.safetensors";
  EXPECT_EQ(verify_report(dir + "/checkpoints").problems, 0);
  std::string piece;
  int64_t at = 0;
  {
    const io::SafetensorsFile f(file);
    for (const io::TensorInfo& t : f.tensors())
      if (t.name.find("exp_avg|") != std::string::npos && t.numel > 10) {
        piece = t.name;
        at = t.begin + 9 * static_cast<int64_t>(t.element_size) + 1;  // a mantissa byte: still finite
        break;
      }
  }
  ASSERT_FALSE(piece.empty());
  {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    io.read(reinterpret_cast<char*>(&header), 8);
    io.seekg(static_cast<std::streamoff>(8 + header + static_cast<uint64_t>(at)));
    char b = 0;
    io.get(b);
    io.seekp(static_cast<std::streamoff>(8 + header + static_cast<uint64_t>(at)));
    io.put(static_cast<char>(b ^ 0x04));
  }
  JobConfig r = job(dir);
  r.checkpoint.resume = "auto";
  const std::string e = error_of([&] { Trainer t(r); });
  EXPECT_NE(e.find(file + ": tensor `" + piece + "` does not match its checksum"), std::string::npos) << e;
  const InspectReport v = verify_report(dir + "/checkpoints");
  EXPECT_EQ(v.problems, 1) << v.text;
  EXPECT_NE(v.text.find("DAMAGED " + file + ": tensor `" + piece + "` does not match its checksum"), std::string::npos)
      << v.text;

  // the export carries checksums too
  const std::string weights = dir + "/hf/model.safetensors";
  EXPECT_EQ(verify_report(dir + "/hf").problems, 0);
  std::string tensor;
  {
    const io::SafetensorsFile f(weights);
    EXPECT_TRUE(f.has_checksums());
    tensor = f.tensors().back().name;
    at = f.tensors().back().begin;
  }
  {
    std::fstream io(weights, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    io.read(reinterpret_cast<char*>(&header), 8);
    io.seekp(static_cast<std::streamoff>(8 + header + static_cast<uint64_t>(at)));
    io.put('\x11');
  }
  JobConfig f = job(fresh_dir("flipped_hf"));
  f.model.hf = dir + "/hf";
  f.data.tokenizer = "byte";
  const std::string hf = error_of([&] { Trainer t(f); });
  EXPECT_NE(hf.find(weights + ": tensor `" + tensor + "` does not match its checksum"), std::string::npos) << hf;
  EXPECT_EQ(verify_report(dir + "/hf").problems, 1);
}

// A NaN in a checkpoint (here in AdamW's second moment) or in a Hugging Face folder's weights
// is an error at load naming the file and the tensor, not a NaN loss steps later. (The
// checksums are resealed over the NaN, as a writer without the save guard would leave them;
// otherwise the checksum names the damage first.)
TEST(Checkpoint, ANonFiniteValueFailsAtLoadNamingFileAndTensor) {
  const std::string dir = fresh_dir("nan_load");
  JobConfig c = job(dir);
  c.training.steps = 3;
  c.export_.folder = dir + "/hf";
  Trainer(c).run();
  const std::string file = dir + "/checkpoints/step_00000003/rank_00000-of-00001.safetensors";
  const std::string piece = poison_element(file, "exp_avg_sq", 3);
  reseal_checksum(file, piece);
  JobConfig r = job(dir);
  r.checkpoint.resume = "auto";
  const std::string e = error_of([&] { Trainer t(r); });
  EXPECT_NE(e.find(file + ": tensor `" + piece + "` element 3 is nan, expected a finite value"), std::string::npos)
      << e;

  const std::string weights = dir + "/hf/model.safetensors";
  ASSERT_TRUE(fs::exists(weights));
  const std::string name = poison_element(weights, "up_proj", 7);
  reseal_checksum(weights, name);
  const InspectReport v = verify_report(dir + "/hf");
  EXPECT_EQ(v.problems, 1) << v.text;
  EXPECT_NE(v.text.find("NOT FINITE " + weights + ": tensor `" + name + "` holds 1 NaN or inf value (the first is "
                        "element 7)"), std::string::npos)
      << v.text;
  JobConfig f = job(fresh_dir("nan_load_hf"));
  f.model.hf = dir + "/hf";
  f.data.tokenizer = "byte";
  const std::string hf = error_of([&] { Trainer t(f); });
  EXPECT_NE(hf.find(weights + ": tensor `" + name + "` element 7 is nan, expected a finite value"), std::string::npos)
      << hf;
}

TEST(Checkpoint, DamageIsNamed) {
  const std::string dir = fresh_dir("damage");
  JobConfig c = job(dir);
  c.training.steps = 3;
  Trainer(c).run();
  const std::string step = dir + "/checkpoints/step_00000003";
  JobConfig r = job(dir);
  r.checkpoint.resume = step;

  // another model shape
  JobConfig other = r;
  other.model.dim = 48;
  EXPECT_NE(error_of([&] { Trainer t(other); }).find("holds a different model"), std::string::npos);

  // a missing rank file
  fs::rename(step + "/rank_00000-of-00001.safetensors", dir + "/moved.safetensors");
  const std::string missing = error_of([&] { Trainer t(r); });
  EXPECT_NE(missing.find("rank_00000-of-00001.safetensors"), std::string::npos) << missing;
  EXPECT_NE(missing.find("missing"), std::string::npos) << missing;
  fs::rename(dir + "/moved.safetensors", step + "/rank_00000-of-00001.safetensors");

  // a format from the future
  {
    std::ifstream in(step + "/metadata.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"version\": 1");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 12, "\"version\": 7");
    std::ofstream(step + "/metadata.json") << text;
  }
  const std::string version = error_of([&] { Trainer t(r); });
  EXPECT_NE(version.find("format version 7"), std::string::npos) << version;

  EXPECT_NE(error_of([&] { read_checkpoint_info(dir + "/nowhere"); }).find("not a directory"), std::string::npos);
}

// Every field of metadata.json is checked for type, range and agreement with the directory
// and its files before anything loads; the error names the file, the field, what was expected
// and what was found. A negative step in particular must not start a run at a negative step.
TEST(Checkpoint, MetadataFieldsAreCheckedBeforeLoading) {
  const std::string dir = fresh_dir("metadata");
  JobConfig c = job(dir);
  c.training.steps = 3;
  Trainer(c).run();
  const std::string step = dir + "/checkpoints/step_00000003";
  const std::string path = step + "/metadata.json";
  nlohmann::json good;
  std::ifstream(path) >> good;
  const std::string rank_file = step + "/rank_00000-of-00001.safetensors";
  const auto rank_file_time = fs::last_write_time(rank_file);
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"negative step", [](nlohmann::json& j) { j["step"] = -3; },
       "field `step` must be an integer >= 0 (the optimizer steps completed), found -3"},
      {"step as text", [](nlohmann::json& j) { j["step"] = "3"; }, "field `step` must be an integer >= 0"},
      {"step not the directory's", [](nlohmann::json& j) { j["step"] = 4; },
       "field `step` = 4 disagrees with the directory's name `step_00000003` (expected `step_00000004`)"},
      {"no step", [](nlohmann::json& j) { j.erase("step"); }, "field `step` is missing"},
      {"zero ranks", [](nlohmann::json& j) { j["world_size"] = 0; },
       "field `world_size` must be an integer >= 1 (the ranks that wrote it), found 0"},
      {"two ranks, one file", [](nlohmann::json& j) { j["world_size"] = 2; },
       "field `files` must list one rank file for each of the 2 ranks (field `world_size`), found 1 entries"},
      {"a foreign file", [](nlohmann::json& j) { j["files"][0] = "../elsewhere.safetensors"; },
       "field `files`[0] must be \"rank_00000-of-00001.safetensors\", found \"../elsewhere.safetensors\""},
      {"tensor parallel past the ranks", [](nlohmann::json& j) { j["tensor_parallel"] = 2; },
       "field `tensor_parallel` must be an integer in [1, world_size = 1], found 2"},
      {"optimizer ahead of the step", [](nlohmann::json& j) { j["optimizer_steps"] = 9; },
       "field `optimizer_steps` must be an integer in [0, step = 3], found 9"},
      {"optimizer flag as text", [](nlohmann::json& j) { j["has_optimizer_state"] = "yes"; },
       "field `has_optimizer_state` must be true or false, found \"yes\""},
      {"tokenizer as a number", [](nlohmann::json& j) { j["tokenizer_source"] = 7; },
       "field `tokenizer_source` must be a string"},
      {"negative model size", [](nlohmann::json& j) { j["config"]["hidden_size"] = -40; }, "field `config`"},
  };
  JobConfig r = job(dir);
  r.checkpoint.resume = step;
  r.training.steps = 6;
  for (const Case& k : cases) {
    nlohmann::json j = good;
    k.edit(j);
    std::ofstream(path) << j.dump(2);
    const std::string e = error_of([&] { read_checkpoint_info(step); });
    EXPECT_NE(e.find(path), std::string::npos) << k.what << ": " << e;
    EXPECT_NE(e.find(k.expected), std::string::npos) << k.what << ": " << e;
    // the trainer stops before a step runs or a file is written
    const std::string t = error_of([&] { Trainer(r).run(); });
    EXPECT_NE(t.find(k.expected), std::string::npos) << k.what << ": " << t;
  }
  EXPECT_TRUE(fs::last_write_time(rank_file) == rank_file_time) << "the checkpoint read from was rewritten";
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step_00000006"));
  std::ofstream(path) << good.dump(2);
  EXPECT_EQ(read_checkpoint_info(step).step, 3);
}

// `shardtrain inspect` on a step directory: what it holds, and whether every element of every
// parameter is there once; a piece removed or doubled is named.
TEST(Checkpoint, TheReportFindsMissingAndDoubledElements) {
  const std::string dir = fresh_dir("report");
  JobConfig c = job(dir);
  c.training.steps = 3;
  Trainer(c).run();
  const std::string step = dir + "/checkpoints/step_00000003";
  EXPECT_EQ(checkpoint_report(step).problems, 0);
  const std::string report = checkpoint_report(step).text;
  EXPECT_NE(report.find("step 3, written by 1 rank; optimizer state: AdamW moments after 3 steps"), std::string::npos)
      << report;
  EXPECT_NE(report.find("model: Llama: 2 layers, dim 40"), std::string::npos) << report;
  EXPECT_NE(report.find("saved by shardtrain " + std::string(build_commit())), std::string::npos) << report;
  EXPECT_NE(report.find("complete: master weights, AdamW m and v of all"), std::string::npos) << report;

  // the rank file rewritten without one piece, then with a piece twice
  const std::string file = step + "/rank_00000-of-00001.safetensors";
  std::vector<std::pair<std::string, Tensor>> pieces;
  {
    const io::SafetensorsFile f(file);
    for (const io::TensorInfo& t : f.tensors()) pieces.emplace_back(t.name, f.read_as(t.name, DType::kF32));
  }
  const auto at = std::find_if(pieces.begin(), pieces.end(), [](const auto& p) {
    return p.first.rfind("model.layers.1.mlp.down_proj.weight|exp_avg|", 0) == 0;
  });
  ASSERT_NE(at, pieces.end());
  std::vector<std::pair<std::string, Tensor>> fewer = pieces;
  fewer.erase(fewer.begin() + (at - pieces.begin()));
  io::write_safetensors(file, fewer, {});
  EXPECT_EQ(checkpoint_report(step).problems, 1);
  const std::string none = checkpoint_report(step).text;
  EXPECT_NE(none.find("exp_avg of `model.layers.1.mlp.down_proj.weight` [40, 52]: no pieces"), std::string::npos)
      << none;
  EXPECT_NE(none.find("INCOMPLETE: 1 problem"), std::string::npos) << none;
  const std::string name = at->first;
  const int64_t end = std::stoll(name.substr(name.rfind(':') + 1));
  ASSERT_EQ(end, 40 * 52);
  // its last 10 elements cut off
  fewer.emplace_back("model.layers.1.mlp.down_proj.weight|exp_avg|0:" + std::to_string(end - 10),
                     at->second.flat_range(0, end - 10));
  io::write_safetensors(file, fewer, {});
  const std::string missing = checkpoint_report(step).text;
  EXPECT_NE(missing.find("exp_avg of `model.layers.1.mlp.down_proj.weight` [40, 52]: elements [2070, 2080) missing"),
            std::string::npos) << missing;
  std::vector<std::pair<std::string, Tensor>> more = pieces;
  // the first elements again, under a name of their own
  more.emplace_back("model.layers.1.mlp.down_proj.weight|exp_avg|0:" + std::to_string(end - 1),
                    at->second.flat_range(0, end - 1));
  io::write_safetensors(file, more, {});
  const std::string doubled = checkpoint_report(step).text;
  EXPECT_NE(doubled.find("exp_avg of `model.layers.1.mlp.down_proj.weight` [40, 52]: element 0 held twice"),
            std::string::npos) << doubled;
}

TEST(Checkpoint, ExportWritesTheTrainedWeights) {
  const std::string dir = fresh_dir("export");
  Trainer t(job(dir));
  t.run();
  ExportOptions o;
  o.folder = dir + "/hf";
  o.dtype = DType::kF32;
  // the checkpoints folder (its `latest`) or a step directory
  EXPECT_EQ(export_checkpoint(dir + "/checkpoints", o), dir + "/checkpoints/step_00000006");
  const io::HfWeights w(o.folder);
  const model::ModelLayout& layout = t.store().layout();
  for (size_t u = 0; u < layout.units().size(); ++u)
    for (const model::ParamSpec& p : layout.units()[u].params) {
      Tensor got = Tensor::empty({p.numel()}, DType::kF32);
      w.read_range(p.name, 0, got);
      EXPECT_TRUE(testing::all_close(got, t.store().master_shards()[u].flat_range(p.offset, p.numel()),
                                     testing::kExact))
          << p.name;
    }
  EXPECT_TRUE(fs::exists(o.folder + "/config.json"));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The end-of-training export is the one checked against transformers (tools/check_hf_export.py);
// exporting the final checkpoint must give the same folder.
TEST(Checkpoint, ExportEqualsTheEndOfTrainingExport) {
  const std::string dir = fresh_dir("export_same");
  JobConfig c = job(dir);
  c.export_.folder = dir + "/at_end";  // bf16, the default
  Trainer(c).run();
  ExportOptions o;
  o.folder = dir + "/from_checkpoint";
  export_checkpoint(dir + "/checkpoints/step_00000006", o);
  EXPECT_EQ(read_text(dir + "/at_end/config.json"), read_text(dir + "/from_checkpoint/config.json"));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    EXPECT_FALSE(read_text(dir + "/at_end/" + f).empty()) << f << ": the byte-level tokenizer's file";
    EXPECT_EQ(read_text(dir + "/at_end/" + f), read_text(dir + "/from_checkpoint/" + f)) << f;
  }
  const io::HfWeights a(dir + "/at_end"), b(dir + "/from_checkpoint");
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    const io::TensorInfo& t = a.get(name);
    EXPECT_EQ(t.dtype, b.get(name).dtype) << name;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    Tensor x = Tensor::empty({n}, DType::kF32), y = Tensor::empty({n}, DType::kF32);
    a.read_range(name, 0, x);
    b.read_range(name, 0, y);
    EXPECT_TRUE(testing::all_close(x, y, testing::kExact)) << name;
  }
}

}  // namespace
}  // namespace shardtrain::train
