// Sampling on a GPU: a Hugging Face folder opened on CUDA (bf16 for `generate`, f32 for the
// check) holds the CPU model's weights (bf16: rounded, bit for bit) and the f32 one gives its
// logits, also over a KV cache one token at a time (bf16: the cache against recomputing, to
// bf16 error); the f32 GPU model samples the CPU model's ids (cached and recomputing), and
// `shardtrain generate --device cuda` runs there. Skips without a device.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "model/captured_decode.h"
#include "model/llama.h"
#include "ops/elementwise.h"
#include "testing/compare.h"
#include "testing/cuda_util.h"
#include "testing/model_folders.h"
#include "testing/shardtrain_binary.h"
#include "train/generate.h"
#include "train/open_model.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

const testing::Tolerance kBf16Logits{1.5e-2, 1e30, 1e30};  // as llama_cuda_test's bf16 forward
const testing::Tolerance kF32Logits{1e-5, 1e30, 1e30};    // other kernels, other summation orders

class OpenModelCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    ST_REQUIRE_CUDA();
    hf_ = (fs::temp_directory_path() / ("shardtrain_open_cuda_" + std::to_string(::getpid()))).string();
    testing::TinyStore source(config_, 43);
    testing::write_hf_folder(source, config_, hf_);
  }
  void TearDown() override {
    if (!hf_.empty()) fs::remove_all(hf_);
  }
  model::LlamaConfig config_ = testing::tiny_generation_config();
  std::string hf_;
};

Tensor on_host(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), DType::kF32, Device::cpu(), "logits on the host");
  ops::cast(h, t);
  return h;
}

TEST_F(OpenModelCuda, GpuModelsFollowTheCpuModel) {
  const Device gpu = generation_device("cuda");
  ASSERT_TRUE(gpu.is_cuda());
  const OpenedModel cpu = open_model(hf_);
  const OpenedModel f32 = open_model(hf_, DType::kF32, gpu);
  const OpenedModel bf16 = open_model(hf_, DType::kBF16, gpu);
  EXPECT_EQ(bf16.model->device(), gpu);
  Tensor ids = Tensor::empty({1, 23}, DType::kI32);
  testing::fill_random_ints(ids, 5, 0, config_.vocab_size);
  const Tensor want = cpu.model->last_logits(ids);
  EXPECT_TRUE(testing::all_close(on_host(f32.model->last_logits(ids)), want, kF32Logits));
  // bf16: every unit's parameters are the CPU model's rounded to bf16, bit for bit
  for (size_t u = 0; u < cpu.layout->units().size(); ++u) {
    Tensor rounded = Tensor::empty(cpu.store->params()[u].shape(), DType::kBF16, Device::cpu(), "rounded");
    ops::cast(rounded, cpu.store->params()[u]);
    EXPECT_TRUE(testing::all_close(on_host(bf16.store->params()[u]), on_host(rounded), testing::kExact)) << "unit " << u;
  }

  // over a KV cache on the GPU (a 7-token prefill, then one token at a time): each position's
  // logits are those of recomputing the prefix, in f32 to f32 error and in bf16 to bf16's
  for (const OpenedModel* m : {&f32, &bf16}) {
    SCOPED_TRACE(dtype_name(m->model->dtype()));
    model::KvCache cache(config_, 1, 23, m->model->dtype(), gpu);
    for (int64_t end = 7; end <= 23; ++end) {
      const Tensor prefix = contiguous(ids.slice(1, 0, end));
      const Tensor fresh = contiguous(ids.slice(1, cache.length(), end));
      const Tensor cached = on_host(m->model->last_logits_cached(fresh, cache));
      const Tensor full = on_host(m->model->last_logits(prefix));
      EXPECT_TRUE(testing::all_close(cached, full,
                                     m == &f32 ? kF32Logits : kBf16Logits)) << "position " << end - 1;
    }
  }

  // greedy ids: the f32 GPU model picks the CPU model's, over its KV cache and recomputing
  const data::ByteTokenizer tok;
  SampleOptions o;
  o.prompt = "Hello";
  o.tokens = 20;
  o.temperature = 0;
  o.context_limit = ContextLimit::kStop;
  const SampleResult on_cpu = sample(*cpu.model, tok, o), on_gpu = sample(*f32.model, tok, o);
  EXPECT_TRUE(on_cpu.used_kv_cache);
  EXPECT_TRUE(on_gpu.used_kv_cache);
  EXPECT_EQ(on_gpu.ids, on_cpu.ids);
  o.kv_cache = false;
  const SampleResult recomputed = sample(*f32.model, tok, o);
  EXPECT_FALSE(recomputed.used_kv_cache);
  EXPECT_EQ(recomputed.ids, on_cpu.ids);
  o.kv_cache = true;
  EXPECT_EQ(sample(*bf16.model, tok, o).ids.size(), on_cpu.ids.size());
}

// One token at a time, the captured step (a CUDA graph replayed at every position) gives the
// eager step's logits bit for bit, in bf16 and f32, and sampling with it picks the same ids.
TEST_F(OpenModelCuda, CapturedDecodingFollowsTheEagerStepBitForBit) {
  const Device gpu = generation_device("cuda");
  Tensor ids = Tensor::empty({1, 30}, DType::kI32);
  testing::fill_random_ints(ids, 9, 0, config_.vocab_size);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    const OpenedModel m = open_model(hf_, dt, gpu);
    model::KvCache eager_cache(config_, 1, 30, dt, gpu), graph_cache(config_, 1, 30, dt, gpu);
    const Tensor prompt = contiguous(ids.slice(1, 0, 7));
    (void)m.model->last_logits_cached(prompt, eager_cache);
    (void)m.model->last_logits_cached(prompt, graph_cache);
    model::CapturedDecode captured(*m.model, graph_cache);
    for (int64_t t = 7; t < 30; ++t) {
      const Tensor one = contiguous(ids.slice(1, t, t + 1));
      const Tensor eager = on_host(m.model->last_logits_cached(one, eager_cache));
      const Tensor replayed = on_host(captured.run(one));
      EXPECT_TRUE(testing::all_close(replayed, eager, testing::kExact)) << "position " << t;
      EXPECT_EQ(captured.captured(), t > 7);
    }
    EXPECT_EQ(graph_cache.length(), 30);
    const data::ByteTokenizer tok;
    SampleOptions o;
    o.prompt = "Hello";
    o.tokens = 40;
    o.temperature = 0.9;
    o.context_limit = ContextLimit::kStop;
    const SampleResult graphed = sample(*m.model, tok, o);
    o.cuda_graph = false;
    EXPECT_EQ(sample(*m.model, tok, o).ids, graphed.ids);
  }
  model::KvCache cpu_cache(config_, 1, 4, DType::kF32, Device::cpu());
  const OpenedModel on_cpu = open_model(hf_);
  EXPECT_TRUE(testing::throws_with([&] { model::CapturedDecode(*on_cpu.model, cpu_cache); }, "CUDA graphs need"));
}

using testing::shardtrain_binary;

TEST_F(OpenModelCuda, GenerateCommandRunsOnTheGpu) {
  const std::string out = hf_ + ".out", err = hf_ + ".err";
  const std::string cmd = shardtrain_binary() + " generate " + hf_ +
                          " --device cuda --tokenizer byte --prompt Hello --tokens 12 --temperature 0 > " + out +
                          " 2> " + err;
  const int st = std::system(cmd.c_str());
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string text = read(out), log = read(err);
  fs::remove(out);
  fs::remove(err);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log;
  EXPECT_EQ(text.rfind("Hello", 0), 0u) << text;
  EXPECT_GT(text.size(), std::string("Hello\n").size()) << text;
  EXPECT_NE(log.find("(bf16 on cuda:0)"), std::string::npos) << log;
  EXPECT_NE(log.find("KV cache"), std::string::npos) << log;
}

}  // namespace
}  // namespace shardtrain::train
