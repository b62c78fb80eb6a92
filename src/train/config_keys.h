// Questions a command line asks about config keys (train/config.cpp holds the key table).
#pragma once

#include <string>

namespace shardtrain::train {

// Whether config key `name` ("section.key") holds a boolean, which a command line may give
// alone to mean true. Throws Error for an unknown key, naming it and the nearest valid one;
// `where` opens the message.
bool is_boolean_key(const std::string& name, const std::string& where);

}  // namespace shardtrain::train
