// Stage partitioning: which contiguous layers each pipeline stage (or model chunk) runs. A pure
// algorithm over numbers — per-layer compute time, model state, activations and boundary
// output — so that any model (transformer, layer table) and any schedule can use it.
//
// The balanced partition follows BaPipe (Zhao et al., "BaPipe: Exploration of Balanced
// Pipeline Parallelism for DNN Training"): dynamic programming over contiguous splits that
// minimises the slowest part, point-to-point transfers included, under each part's memory.
#pragma once

#include <vector>

#include "hw_models/units.hpp"

namespace stratasim::strategies {

/// One layer as the partitioner sees it (per microbatch, per rank).
struct LayerCost {
  Time compute;       // forward + backward (+ recompute) time of one microbatch
  Bytes state;        // model state the layer keeps on the device (weights, gradients, optimizer)
  Bytes activations;  // stored per in-flight microbatch
  Bytes output;       // sent to the next stage when the layer ends a stage (and its gradient back)
};

struct PartitionProblem {
  std::vector<LayerCost> layers;  // in model order
  int parts = 1;                  // stages (model chunks) to split into, each non-empty
  /// The first part's extra work (embedding): compute, state and activations added to part 0
  /// (its `output` is not used).
  LayerCost first_extra;
  /// The last part's extra work (final norm, LM head and loss), added to part parts - 1.
  LayerCost last_extra;
  /// In-flight microbatches whose activations part i holds at its peak (the schedule's: 1F1B
  /// p - i, GPipe m, ...); one entry per part; empty = 1 each.
  std::vector<int> in_flight;
  /// Device memory available per part for state + in_flight * activations; one entry per part
  /// (an entry of 0 = unlimited), or empty = unlimited for all.
  std::vector<Bytes> capacity;
  /// Link bandwidth between consecutive parts (0 = the bytes cost nothing; the latency still
  /// counts).
  Bandwidth p2p;
  Time p2p_latency;
  /// Devices that differ (a mixed cluster, a straggler): the compute time of each layer on each
  /// part's own device, parts x layers, used instead of layers[l].compute; empty = every part
  /// runs a layer in layers[l].compute. The extras stay first_extra / last_extra (give them as
  /// their parts' devices run them).
  std::vector<std::vector<Time>> compute_by_part;
};

struct PartitionPlan {
  std::vector<int> layers_per_part;  // sums to layers.size()
  /// Compute + p2p of each part. Every boundary between parts k and k + 1 costs
  /// output / p2p + p2p_latency twice: the forward send of the activation, counted on part k,
  /// and the backward send of its gradient, counted on part k + 1.
  std::vector<Time> part_time;
  std::vector<Bytes> part_memory;  // state + in_flight * activations (extras included)
  Time bottleneck;                 // max part_time

  bool operator==(const PartitionPlan&) const = default;
};

/// BaPipe's balanced partition: dynamic programming over contiguous splits minimising the
/// bottleneck (max part time, p2p included), subject to every part fitting its capacity; ties
/// are broken by the smaller sum of squares of part times, then by the earliest split (the
/// lexicographically smallest layers_per_part), so the result is deterministic. O(parts * L^2).
///
/// Throws std::invalid_argument on a malformed problem (parts < 1 or more than the layers,
/// negative costs, in_flight or capacity of the wrong length) and when no split fits; the
/// message then names a part and the bytes it needs: a part that cannot fit even with a
/// single layer ("part 0 needs at least 81.2 GiB of 80 GiB"), or else the split that comes
/// closest (the one minimising the largest overflow) and its worst part.
PartitionPlan balanced_partition(const PartitionProblem& problem);

/// Evaluates a given split (even or explicit) with the same cost model; no capacity check
/// (memory is reported). Throws std::invalid_argument unless layers_per_part has one positive
/// entry per part summing to the layers.
PartitionPlan evaluate_partition(const PartitionProblem& problem,
                                 const std::vector<int>& layers_per_part);

/// Even split: layers as evenly as possible, earlier parts taking the remainder (as
/// strategies::stage_layers does). Throws std::invalid_argument unless 1 <= parts <= layers.
std::vector<int> even_partition(int layers, int parts);

}  // namespace stratasim::strategies
