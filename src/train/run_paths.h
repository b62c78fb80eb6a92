// The folders a run writes, checked at launch: each created and probed with a small file, so
// that an unwritable checkpoint or export folder fails before the first step, naming its key.
#pragma once

#include <string>
#include <vector>

namespace shardtrain::train {

// Creates folder `path` (with its parents) and creates and removes a small file in it.
// Throws naming `key` (the config key the path comes from, as `checkpoint.dir`), the path and
// the reason: "`checkpoint.dir` = \"/x\" is not writable: Permission denied". `rank` keeps the
// probe files of ranks sharing one folder apart.
void check_writable_folder(const std::string& path, const std::string& key, int rank);

// Removes what interrupted writes left in `folder`: files named <name>.tmp.<digits> (a file
// written under a temporary name, then renamed) and, with `checkpoint_root`, the .step_N.tmp
// directories of unfinished saves, or else the shard-N.partial.safetensors of an unfinished
// export. Returns the names removed. Call it before this process starts writing there: a
// save in progress would lose its files.
std::vector<std::string> remove_interrupted_writes(const std::string& folder, bool checkpoint_root);

}  // namespace shardtrain::train
