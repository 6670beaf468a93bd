// Stage partitioning with costs: the experiment's layers priced by the device cost model and the
// analytical network (sim/), handed to the pure partitioner of strategies/partition.hpp (BaPipe's
// balanced dynamic programme). strategies/ cannot see the cost model and sim/ knows no
// experiments, so this composition lives in study/.
#pragma once

#include <vector>

#include "hw_models/cluster.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "strategies/partition.hpp"

namespace stratasim::study {

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

}  // namespace stratasim::study
