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

// An export (export_hf) is written whole into the sibling `<target>.tmp.<pid>` in the target's
// parent folder and then swapped in: the old target renamed to `<target>.old.<pid>`, the new
// folder renamed to the target, the old one removed. A reader sees the old folder or the new
// one, never a mix of two exports' shards.

// Whether `name` is a file an export writes (config.json, the tokenizer files, *.safetensors,
// model.safetensors.index.json) or a temporary of one.
bool is_export_file(const std::string& name);

// Checks that `target` may be replaced by an export: absent, or a real folder (not a symlink)
// holding only files an export writes. Throws naming `key` (as `export.folder`), the target and
// the first unexpected entry, before any work, so that none of the user's files is deleted.
void check_export_target(const std::string& target, const std::string& key);

// check_export_target, then creates the target's parent folder and probes it with a small
// file, as check_writable_folder does; the target itself is neither created nor touched.
void check_export_location(const std::string& target, const std::string& key, int rank);

// `<target>.<kind>.<pid>` beside `target` (kind "tmp" or "old"); a trailing '/' is ignored.
std::string export_sibling(const std::string& target, const std::string& kind, long pid);

// Removes the `<target>.tmp.<digits>` and `<target>.old.<digits>` siblings that interrupted
// exports left. Returns the names removed.
std::vector<std::string> remove_interrupted_exports(const std::string& target);

// Swaps the finished folder `staged` in as `target` (see above), after check_export_target and
// an fsync of `staged`'s files and of the folders renamed. On failure the old target stays.
void swap_in_export(const std::string& staged, const std::string& target, const std::string& key);

}  // namespace shardtrain::train
