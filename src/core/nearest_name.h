// Suggesting the name a typo meant (a command, an option, a config key).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain {

// Edits from `a` to `b`: insert, delete, replace, or swap two neighbours (the optimal string
// alignment distance).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest `name` by edit distance (the first of equals), or "" for none. With
// `close_only` a candidate must be a typo's distance away: two edits, or a third of the name.
std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates, bool close_only = true);

}  // namespace shardtrain
