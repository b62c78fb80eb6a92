// Context parallelism in the trainer under mpirun (2, 3 and 4 ranks): parallel.context_parallel
// = n splits each sequence over groups of n consecutive ranks (at 4 also 2 context x 2 data
// parallel, and that in 2 replicas), and the run trains as one rank with the whole global
// batch: the same losses and gradient norms at every step and the same held-out loss (f32,
// 1e-5 relative), the same tokens per step, at the job's length and at the shortest one (2n
// tokens), with packed documents spanning the chunks as without. Every refusal names its keys,
// and a context-parallel checkpoint resumes on one rank without it.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "dist/mpi_communicator.h"
#include "testing/compare.h"
#include "testing/mesh_jobs.h"
#include "testing/training_curves.h"
#include "train/trainer.h"

namespace shardtrain {
namespace {

struct ContextMesh {
  int cp, dp, replicate;
};

// Every context degree above 1 that divides `world`, with the data-parallel ranks beside it;
// at 4 ranks also 2 x 2 as 2 replicas (HSDP: the units sharded inside each replica).
std::vector<ContextMesh> context_meshes(int world) {
  std::vector<ContextMesh> out;
  for (int cp = 2; cp <= world; ++cp)
    if (world % cp == 0) out.push_back({cp, world / cp, 1});
  if (world == 4) out.push_back({2, 2, 2});
  return out;
}

std::string corpus_file(int rank) { return testing::mesh_corpus_file("cp", rank); }

// Documents of 5 to 15 bytes, so that a sequence of 24 tokens packs several, and they span
// the chunks of a context group.
std::string short_documents_file(int rank) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("shardtrain_cp_documents_" + std::to_string(::getpid()) + "_" + std::to_string(rank) + ".txt"))
                               .string();
  std::ofstream out(path);
  for (int i = 0; i < 600; ++i) out << "D" << i << std::string(static_cast<size_t>(i * 7 % 11), 'x') << ".\n\n";
  return path;
}

// The mesh tests' job with `cp` ranks to a sequence of `seq_len` tokens, in a run folder of
// this test's `world` ranks.
train::JobConfig context_job(const std::string& corpus, int64_t batch_size, int cp, int64_t seq_len, int world) {
  train::JobConfig c = testing::mesh_job(corpus, batch_size, 1);
  c.parallel.context_parallel = cp;
  c.training.seq_len = seq_len;
  c.run.output_dir =
      (std::filesystem::temp_directory_path() / ("shardtrain_cp_run_np" + std::to_string(world))).string();
  c.run.overwrite = true;
  return c;
}

// With packed documents (data.document_mask = on, on a corpus of short documents) as without:
// a document that spans chunks and ranks attends as on one rank.
TEST(ContextParallelTrainer, MatchesOneRank) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const std::string corpus = corpus_file(comm->rank()), documents = short_documents_file(comm->rank());
  const int64_t B = 2;
  auto single = dist::make_single_rank();
  for (const bool masked : {false, true})
  for (const auto& [cp, dp, replicate] : context_meshes(w)) {
    for (const int64_t T : {int64_t{24}, int64_t{2 * cp}}) {  // the job's length, and the shortest: one token a chunk
      SCOPED_TRACE("context " + std::to_string(cp) + " x data " + std::to_string(dp) + ", " +
                   std::to_string(replicate) + " replica(s), seq_len " + std::to_string(T) +
                   (masked ? ", packed documents" : "") + ", rank " + std::to_string(comm->rank()));
      const std::string& text = masked ? documents : corpus;
      const std::string mask = masked ? "on" : "off";
      // one rank with the whole global batch: B sequences per data-parallel rank
      train::JobConfig one = context_job(text, B * dp, 1, T, w);
      one.data.document_mask = mask;
      one.run.output_dir += "_rank" + std::to_string(comm->rank());  // every rank runs it alone
      train::Trainer ref(one, single.get());
      const train::TrainSummary a = ref.run();
      if (masked && T == 24) {  // the mask matters: without it the same run learns otherwise
        train::JobConfig unmasked = one;
        unmasked.data.document_mask = "off";
        const train::TrainSummary u = train::Trainer(unmasked, single.get()).run();
        EXPECT_GT(std::abs(u.steps.back().loss - a.steps.back().loss), 1e-3 * a.steps.back().loss);
      }
      train::JobConfig c = context_job(text, B, cp, T, w);
      c.data.document_mask = mask;
      c.parallel.replicate = replicate;
      train::Trainer t(c, comm.get());
      EXPECT_EQ(t.mesh().shape().replicate, replicate);
      EXPECT_EQ(t.context_degree(), cp);
      EXPECT_EQ(t.data_ranks(), dp);
      EXPECT_EQ(t.data_rank(), comm->rank() / cp);
      ASSERT_NE(t.model().context_parallel(), nullptr);
      const train::TrainSummary b = t.run();
      const bool clipped = testing::expect_same_curves(a, b, 1e-5, 0.5);
      if (T == 24) {
        EXPECT_TRUE(clipped) << "the test should exercise clipping";
      }
      // each token counts once: the context group's ranks share their sequences
      EXPECT_EQ(b.timed.tokens_per_step, a.timed.tokens_per_step);
      EXPECT_EQ(b.timed.tokens_per_step, static_cast<double>(B * dp * T * 2));
    }
  }
  std::filesystem::remove(corpus);
  std::filesystem::remove(documents);
}

// Packed fine-tuning examples (data.format = sft, whose document mask is on by auto) train
// under context parallelism as on one rank.
TEST(ContextParallelTrainer, PackedExamplesTrainAsOnOneRank) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const std::string examples = std::filesystem::temp_directory_path().string() + "/shardtrain_cp_examples_" +
                               std::to_string(::getpid()) + "_" + std::to_string(comm->rank()) + ".jsonl";
  {
    std::ofstream out(examples);
    for (int i = 0; i < 60; ++i)
      out << "{\"prompt\": \"Q" << i << ": \", \"response\": \"A" << i % 5 << " and " << i << ".\"}\n";
  }
  auto single = dist::make_single_rank();
  train::JobConfig one = context_job(examples, 2, 1, 24, w);
  one.data.format = "sft";
  one.run.output_dir += "_sft_rank" + std::to_string(comm->rank());
  const train::TrainSummary a = train::Trainer(one, single.get()).run();
  train::JobConfig c = context_job(examples, 2, w, 24, w);
  c.data.format = "sft";
  c.run.output_dir += "_sft";
  train::Trainer t(c, comm.get());
  ASSERT_NE(t.model().context_parallel(), nullptr);
  testing::expect_same_curves(a, t.run(), 1e-5, 0.5);
  std::filesystem::remove(examples);
}

// A run with a sample at its end decodes on every rank as one rank would: the ring is set
// aside for it (the KV cache's decoding refuses it) and restored after.
TEST(ContextParallelTrainer, SamplesAtTheEnd) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const std::string corpus = corpus_file(comm->rank());
  train::JobConfig c = context_job(corpus, 2, w, 24, w);
  c.training.steps = 2;
  c.sample.tokens = 6;
  c.sample.temperature = 0;
  train::Trainer t(c, comm.get());
  const train::TrainSummary s = t.run();
  EXPECT_FALSE(s.sample.empty());
  EXPECT_NE(t.model().context_parallel(), nullptr);
  std::filesystem::remove(corpus);
}

TEST(ContextParallelTrainer, RefusesWhatItCannotRun) {
  auto comm = dist::make_mpi_world();
  const int w = comm->world_size();
  const std::string corpus = corpus_file(comm->rank());
  // a degree that does not divide the ranks (at a length it divides)
  EXPECT_TRUE(testing::throws_with(
      [&] { train::Trainer t(context_job(corpus, 2, w + 1, 4 * (w + 1), w), comm.get()); },
      "parallel.context_parallel = " + std::to_string(w + 1) + " must divide the " + std::to_string(w) + " ranks"));
  // a length that does not cut into 2n chunks
  EXPECT_TRUE(testing::throws_with([&] { train::Trainer t(context_job(corpus, 2, w, 2 * w + 1, w), comm.get()); },
                                   "make training.seq_len a multiple of 2 x parallel.context_parallel"));
  // tensor parallelism beside it
  if (w % 2 == 0) {
    train::JobConfig c = testing::mesh_job(corpus, 2, 2);
    c.parallel.context_parallel = 2;
    EXPECT_TRUE(testing::throws_with([&] { train::Trainer t(c, comm.get()); },
                                     "`parallel.context_parallel` (2) with `parallel.tensor_parallel` (2)"));
  }
  // FP8 attention
  train::JobConfig fp8 = context_job(corpus, 2, w, 24, w);
  fp8.training.fp8_attention = true;
  EXPECT_TRUE(testing::throws_with([&] { train::Trainer t(fp8, comm.get()); },
                                   "with `training.fp8_attention` = true"));
  std::filesystem::remove(corpus);
}

// A checkpoint of a context-parallel run (sharded per unit over every rank) resumes on one rank
// without context parallelism and continues as the run that wrote it (to rounding: the ring
// sums in another order).
TEST(ContextParallelTrainer, CheckpointResumesOnOneRankWithoutIt) {
  auto comm = dist::make_mpi_world();
  const int r = comm->rank(), w = comm->world_size();
  const std::string corpus = corpus_file(r);
  const std::string root =
      (std::filesystem::temp_directory_path() / ("shardtrain_cp_ckpt_np" + std::to_string(w))).string();
  if (r == 0) std::filesystem::remove_all(root);
  comm->barrier();
  train::JobConfig c = context_job(corpus, 2, w, 24, w);
  c.training.steps = 6;
  c.checkpoint.interval_steps = 3;
  c.checkpoint.keep = 0;
  c.checkpoint.dir = root + "/cp";
  const train::TrainSummary all = train::Trainer(c, comm.get()).run();
  comm->barrier();
  if (r == 0) {
    train::JobConfig one = c;
    one.parallel.context_parallel = 1;
    one.checkpoint.resume = root + "/cp/step_00000003";
    one.checkpoint.dir = root + "/resumed";
    auto single = dist::make_single_rank();
    const train::TrainSummary resumed = train::Trainer(one, single.get()).run();
    ASSERT_EQ(resumed.steps.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(resumed.steps[i].loss, all.steps[i + 3].loss, 1e-5 * all.steps[i + 3].loss) << "step " << i + 4;
  }
  comm->barrier();
  if (r == 0) std::filesystem::remove_all(root);
  std::filesystem::remove(corpus);
}

}  // namespace
}  // namespace shardtrain
