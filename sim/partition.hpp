// Stage partitioning with costs: the experiment's layers priced by the device cost model and the
// analytical network, handed to the pure partitioner of strategies/partition.hpp (BaPipe's
// balanced dynamic programme). strategies/ cannot see the cost model, so this glue lives here.
#pragma once

#include <vector>

#include "hw_models/cluster.hpp"
#include "sim/memory.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "strategies/partition.hpp"

namespace stratasim::sim {

/// The partition problem of `experiment` over its schedule's model parts:
/// - per layer: one microbatch's forward and backward time (kernels from DeviceCostModel,
///   tensor-parallel collectives from AnalyticalNetwork on a group of tp ranks), its model state
///   per rank under the experiment's ZeRO stage, its stored activations, its output;
/// - first_extra: the embedding (with the first layer's input), last_extra: final norm, LM head
///   and loss — costed from plans of the first and last part with no layers;
/// - in_flight: microbatches whose activations each part holds at its peak under the schedule;
/// - capacity: the device's memory less the reserved overhead, over the fragmentation factor,
///   shared by the parts a device holds;
/// - p2p: the link between the devices of two consecutive stages (inter-node when they are on
///   different nodes).
strategies::PartitionProblem partition_problem(const strategies::Experiment& experiment);

/// Layers per model part as the experiment asks: even, explicit, or balanced (the plan of
/// balanced_partition(partition_problem(experiment))).
std::vector<int> partition_layers(const strategies::Experiment& experiment);

/// strategies::lower with the experiment's partition applied (balanced included).
strategies::Program lower_partitioned(const strategies::Experiment& experiment,
                                      const strategies::LowerOptions& options = {});

/// Whether the replicas of a rank (data-parallel, or 1D tensor-parallel) behave alike on
/// `cluster`, so that one may be simulated for all (Program::set_replica): on the analytical
/// network (no contention) with identical devices. On the flow-level network replicas contend
/// for links, and with per-device overrides they differ.
bool replicas_behave_alike(const hw::ClusterSpec& cluster);

/// The allocator and framework overheads the experiment sets (fragmentation, reserved memory).
MemoryOverheads memory_overheads(const strategies::Experiment& experiment);

}  // namespace stratasim::sim
