// Opening an HF folder or a checkpoint for sampling: every parameter read whole into one
// resident buffer per unit (no gradients, no optimizer state, no sharding).
#include "train/open_model.h"

#include <filesystem>

#include <fmt/format.h>

#ifdef SHARDTRAIN_WITH_CUDA
#include "core/cuda/device.h"
#endif
#include "io/hf_folder.h"
#include "model/hf_config.h"
#include "ops/elementwise.h"
#include "train/checkpoint.h"
#include "train/hf_fused.h"

namespace shardtrain::train {
namespace {

namespace fs = std::filesystem;

void read_hf_weights(OpenedModel& m, const model::LlamaConfig& config) {
  io::HfWeights weights(m.path);
  expose_fused_tensors(weights, config);  // Phi-3's qkv_proj and gate_up_proj, split
  for (size_t u = 0; u < m.layout->units().size(); ++u)
    for (const model::ParamSpec& p : m.layout->units()[u].params) {
      const io::TensorInfo& t = weights.get(p.name);
      ST_CHECK(Shape(t.shape.begin(), t.shape.end()) == p.shape, "`", m.path, "`: tensor `", p.name, "` has shape ",
               Shape(t.shape.begin(), t.shape.end()).str(), ", config.json implies ", p.shape.str());
      Tensor dst = m.store->params()[u].flat_range(p.offset, p.numel());
      weights.read_range(p.name, 0, dst);
    }
}

}  // namespace

std::string OpenedModel::describe() const {
  return source == ModelSource::kHuggingFace ? fmt::format("Hugging Face folder {}", path)
                                             : fmt::format("checkpoint {} (step {})", path, step);
}

Device generation_device(const std::string& wanted) {
  ST_CHECK(wanted == "auto" || wanted == "cpu" || wanted == "cuda", "generate: --device takes auto, cpu or cuda, "
           "found `", wanted, "`");
  if (wanted == "cpu") return Device::cpu();
#ifdef SHARDTRAIN_WITH_CUDA
  const int n = cuda::device_count();
  ST_CHECK(wanted != "cuda" || n > 0, "generate: --device cuda, but no usable CUDA device is visible");
  if (n > 0) {
    cuda::init_device(0);
    return Device::cuda(0);
  }
#else
  ST_CHECK(wanted != "cuda", "generate: --device cuda, but this build has no CUDA backend (rebuild with nvcc)");
#endif
  return Device::cpu();
}

OpenedModel open_model(const std::string& path, DType dtype, Device device) {
  if (device.is_cpu())
    ST_CHECK(dtype == DType::kF32 || dtype == DType::kF64, "open_model: the CPU model computes in f32 or f64, not ",
             dtype_name(dtype));
  else
    ST_CHECK(dtype == DType::kBF16 || dtype == DType::kF32, "open_model: a GPU model computes in bf16 or f32, not ",
             dtype_name(dtype));
  std::error_code ec;
  ST_CHECK(fs::exists(path, ec), "model `", path, "` does not exist (expected a Hugging Face folder or a training "
           "checkpoint)");
  ST_CHECK(fs::is_directory(path, ec), "model `", path, "` is a file; expected a Hugging Face folder (config.json "
           "and safetensors) or a training checkpoint (a step_* directory, or the folder holding `latest`)");
  OpenedModel m;
  model::LlamaConfig config;
  std::string step_dir;
  CheckpointInfo info;
  if (fs::exists(fs::path(path) / "metadata.json", ec)) {
    step_dir = path;
  } else if (fs::exists(fs::path(path) / "latest", ec)) {
    step_dir = resolve_checkpoint("auto", path);
  } else {
    ST_CHECK(fs::exists(fs::path(path) / "config.json", ec), "model `", path, "` holds neither config.json (a "
             "Hugging Face folder) nor metadata.json (a checkpoint's step directory) nor `latest` (a folder of "
             "checkpoints)");
  }
  if (step_dir.empty()) {
    m.source = ModelSource::kHuggingFace;
    m.path = path;
    config = model::load_hf_config((fs::path(path) / "config.json").string());
    if (fs::exists(fs::path(path) / "tokenizer.json", ec)) m.tokenizer_source = path;
  } else {
    info = read_checkpoint_info(step_dir);
    m.source = ModelSource::kCheckpoint;
    m.path = step_dir;
    m.step = info.step;
    m.tokenizer_source = info.tokenizer_source;
    config = info.config;
  }
  m.layout = std::make_unique<model::ModelLayout>(model::ModelLayout::llama(config, 1));
  // read on the host in the model's dtype (f32 for a GPU model), then moved to the GPU
  const DType host_dtype = device.is_cpu() ? dtype : DType::kF32;
  m.store = std::make_unique<model::ResidentUnitStore>(*m.layout, host_dtype, Device::cpu(), false);
  if (m.source == ModelSource::kHuggingFace) {
    with_context([&] { return fmt::format("reading the weights of `{}`", path); }, [&] { read_hf_weights(m, config); });
  } else {
    load_checkpoint_params(info, *m.layout, m.store->params());
  }
  if (!device.is_cpu()) {
    auto on_device = std::make_unique<model::ResidentUnitStore>(*m.layout, dtype, device, false);
    for (size_t u = 0; u < m.layout->units().size(); ++u) {
      ops::cast(on_device->params()[u], m.store->params()[u]);
      m.store->params()[u] = Tensor();  // the host copy goes unit by unit
    }
    synchronize(device);
    m.store = std::move(on_device);
  }
  m.model = std::make_unique<model::Llama>(config, *m.layout, m.store.get(), dtype, device);
  return m;
}

std::unique_ptr<data::Tokenizer> open_tokenizer(const std::string& spec, const OpenedModel& m) {
  constexpr const char* kValues = "a tokenizer.json, the folder holding one, or `byte` (the byte-level tokenizer)";
  std::string path = spec;
  if (path.empty()) {
    if (m.source == ModelSource::kHuggingFace) {
      ST_CHECK(!m.tokenizer_source.empty(), "`", m.path, "` holds no tokenizer.json; name one with --tokenizer PATH, "
               "which takes ", kValues);
    }
    path = m.tokenizer_source.empty() ? "byte" : m.tokenizer_source;  // a checkpoint of the byte tokenizer
  }
  std::unique_ptr<data::Tokenizer> t =
      spec.empty() ? data::load_tokenizer(path, fmt::format("the tokenizer {} names (another one: --tokenizer PATH)",
                                                            m.describe()),
                                          kValues)
                   : data::load_tokenizer(path, "--tokenizer", kValues);
  const int64_t V = m.model->config().vocab_size;
  ST_CHECK(t->vocab_size() <= V, "the tokenizer `", path, "` has ", t->vocab_size(), " tokens but the model (",
           m.describe(), ") has a vocabulary of ", V, "; use the model's own tokenizer");
  return t;
}

}  // namespace shardtrain::train
