// Context parallelism's group over a communicator (model/context_parallel.h), and the split of
// a run's ranks into context groups: `degree` consecutive ranks hold the chunks of the same
// sequences, and the ranks with one place in their groups form the data-parallel dimension
// that draws different sequences.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "model/context_parallel.h"

namespace shardtrain::fsdp {

// `comm` (not owned) holds the ranks of one context group, in ring order.
std::unique_ptr<model::ContextParallel> make_context_parallel(dist::Communicator* comm);

// The context groups of `world` (collective): rank w is member w % degree of group w / degree.
// Throws, naming parallel.context_parallel, unless degree divides the world.
struct ContextGroups {
  int degree = 1;
  std::unique_ptr<dist::Communicator> group;               // this rank's context group
  std::unique_ptr<dist::Communicator> across;              // the ranks of this rank's place in every group
  int data_rank() const { return across->rank(); }         // which sequences this rank draws
  int data_ranks() const { return across->world_size(); }  // how many draw different sequences
};
ContextGroups split_context_groups(dist::Communicator& world, int degree);

}  // namespace shardtrain::fsdp
