// Opening HF weight folders (single file or indexed shards).
#include "io/hf_folder.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace shardtrain::io {

HfWeights::HfWeights(const std::string& folder) : source_(folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(folder, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(folder));
  } else {
    ST_CHECK(fs::is_directory(folder, ec), "`", folder, "` is neither a folder nor a .safetensors file");
    const fs::path index = fs::path(folder) / "model.safetensors.index.json";
    const fs::path single = fs::path(folder) / "model.safetensors";
    if (fs::exists(index, ec)) {
      std::ifstream in(index);
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      ST_CHECK(!j.is_discarded() && j.is_object(), index.string(), ": not a JSON object");
      ST_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index.string(), ": missing object `weight_map`");
      std::map<std::string, const SafetensorsFile*> by_file;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        ST_CHECK(it.value().is_string(), index.string(), ": `weight_map.", it.key(), "` must be a file name");
        const std::string file = it.value().get<std::string>();
        ST_CHECK(file.find('/') == std::string::npos && file != ".." && !file.empty(), index.string(),
                 ": `weight_map.", it.key(), "` = `", file, "` must be a file in the folder");
        if (by_file.count(file) == 0) {
          const fs::path p = fs::path(folder) / file;
          ST_CHECK(fs::exists(p, ec), index.string(), ": tensor `", it.key(), "` maps to `", file, "`, which is missing");
          files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
          by_file[file] = files_.back().get();
        }
        const SafetensorsFile* f = by_file[file];
        ST_CHECK(f->find(it.key()) != nullptr, index.string(), ": tensor `", it.key(), "` is not in `", file, "`");
        where_[it.key()] = f;
      }
      return;
    }
    ST_CHECK(fs::exists(single, ec), "`", folder, "` holds neither model.safetensors nor model.safetensors.index.json");
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
  }
  for (const TensorInfo& t : files_.front()->tensors()) where_[t.name] = files_.front().get();
}

void HfWeights::add_view(const std::string& name, const std::string& of, int64_t offset,
                         const std::vector<int64_t>& shape) {
  const TensorInfo& whole = get(of);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  ST_CHECK(offset >= 0 && offset + numel <= whole.numel, "`", source_, "`: `", name, "` as ", numel,
           " elements from element ", offset, " of `", of, "`, which has ", whole.numel);
  ST_CHECK(where_.count(name) == 0, "`", source_, "`: `", name, "` is both a tensor of its own and a part of `", of,
           "`; keep one of them");
  View v;
  v.of = of;
  v.offset = offset;
  v.info = whole;
  v.info.name = name;
  v.info.shape = shape;
  v.info.numel = numel;
  v.info.begin = whole.begin + offset * static_cast<int64_t>(whole.element_size);
  v.info.end = v.info.begin + numel * static_cast<int64_t>(whole.element_size);
  views_[name] = std::move(v);
}

const TensorInfo* HfWeights::find(const std::string& name) const {
  if (auto v = views_.find(name); v != views_.end()) return &v->second.info;
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second->find(name);
}

const TensorInfo& HfWeights::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  ST_CHECK(t != nullptr, "`", source_, "`: no tensor named `", name, "`");
  return *t;
}

void HfWeights::read_range(const std::string& name, int64_t first, Tensor& out) const {
  if (auto v = views_.find(name); v != views_.end()) {
    ST_CHECK(first >= 0 && first + out.numel() <= v->second.info.numel, "`", source_, "`: elements [", first, ", ",
             first + out.numel(), ") of `", name, "`, which has ", v->second.info.numel);
    return read_range(v->second.of, v->second.offset + first, out);
  }
  auto it = where_.find(name);
  ST_CHECK(it != where_.end(), "`", source_, "`: no tensor named `", name, "`");
  it->second->read_range(name, first, out);
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> n;
  for (const auto& [name, file] : where_) n.push_back(name);
  return n;
}

}  // namespace shardtrain::io
