// The tokens of a fine-tuning example that count in the loss, as text: each run of counted
// tokens decoded and bracketed, e.g. "[Paris.<|eot_id|>][Rome.<|eot_id|>]".
#pragma once

#include <string>
#include <vector>

#include "data/sft.h"
#include "data/tokenizer.h"

namespace shardtrain::testing {

inline std::string counted_runs(const data::Tokenizer& t, const data::SftExample& e) {
  std::string out;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= e.ids.size(); ++i) {
    if (i < e.ids.size() && e.counted[i]) {
      run.push_back(e.ids[i]);
    } else if (!run.empty()) {
      out += '[' + t.decode(run) + ']';
      run.clear();
    }
  }
  return out;
}

}  // namespace shardtrain::testing
