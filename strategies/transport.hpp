// The experiment's transport policy (the `transport` section, docs/priorities.md): which
// priority class each transfer gets on the flow-level network, how links schedule classes, and
// how much of a gradient message may be lost. After DLCP (Wang et al., "Domain-specific
// Communication Optimization for Distributed DNN Training", arXiv 2020): gradients of earlier
// layers first, so that the next iteration's forward can start, and a bounded loss of gradient
// packets to cut tail latency.
//
// Classes are derived from each transfer op's provenance (stream, phase, layer range) when the
// program simulator starts it: the Program does not change.
// - priority "none": every transfer in class 0 (links share max-min fairly, as without the
//   section);
// - "layer": a transfer op with a layer range gets class floor(layer_begin x classes / L), L
//   the program's layer count (the largest layer_end of its ops), so layers fall evenly into
//   `classes` classes, earlier layers more urgent; an op with no layer range gets the least
//   urgent class, classes - 1;
// - "rules": the first rule that matches the op gives its class (a rule matches by stream,
//   phase and the op's first layer in [layers[0], layers[1]], each optional; streams and
//   phases by their report names, "dp-comm" or "dp_comm"); no match: the least urgent class.
// - "fifo": message-level first in, first out, the baseline DLCP and P3 (Jayarajan et al.,
//   "Priority-based Parameter Propagation for Distributed DNN Training", SysML 2019) compare
//   with: a framework that sends messages in the order it generates them. Every transfer is
//   strictly more urgent than each transfer started after it (its class is its start order in
//   the run, given by the program simulator; `classes` does not apply), so on a shared link the
//   earliest message is served first and later ones take only what it leaves. Strict only.
// Order within a class (`within_class`, with "layer" or "rules" and strict scheduling): "fair"
// (the default: a class's transfers on a link share it max-min fairly) or "fifo" (the earlier
// started transfer of a class first, as a sender's priority queue does with equal priorities:
// P3's and ByteScheduler's queues, FIFO switch queues per priority in DLCP). A transfer's level
// is then (class, start order): class c's transfers are all more urgent than class c + 1's,
// and among themselves in start order.
// Scheduling at a link: "strict" (a class gets bandwidth only after every more urgent class's
// flows there have their max-min rates) or "weighted" (weighted max-min, class c's flows at
// weight weights[c]). The analytical network has no links to share and ignores classes.
//
// Bounded loss (loss_bound e in [0, 1)): a gradient message (is_gradient_message) completes
// once (1 - e) of its bytes are delivered; the last e is dropped, on either network.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "strategies/program.hpp"

namespace stratasim::strategies {

enum class PriorityPolicy : std::uint8_t { none, layer, rules, fifo };
enum class LinkScheduling : std::uint8_t { strict, weighted };
enum class ClassOrder : std::uint8_t { fair, fifo };
std::string_view name_of(PriorityPolicy p);
std::string_view name_of(LinkScheduling s);
std::string_view name_of(ClassOrder o);

/// One user rule: which ops it matches (unset: any) and the class it gives them.
struct PriorityRule {
  std::optional<Stream> stream;
  std::optional<Phase> phase;
  std::optional<std::pair<int, int>> layers;  // first layer of the op, inclusive bounds
  int klass = 0;
  bool matches(const Op& op) const;
};

/// The `transport` section. Defaults: no classes, no loss (results as without the section).
struct TransportPolicy {
  PriorityPolicy priority = PriorityPolicy::none;
  LinkScheduling scheduling = LinkScheduling::strict;
  ClassOrder within_class = ClassOrder::fair;
  int classes = 8;              // 1 .. kMaxClasses
  std::vector<double> weights;  // weighted: one per class, each > 0
  std::vector<PriorityRule> rules;
  double loss_bound = 0;  // in [0, 1)

  static constexpr int kMaxClasses = 64;

  /// Whether any transfer may get a class other than 0.
  bool classed() const {
    return priority == PriorityPolicy::fifo || (priority != PriorityPolicy::none && classes > 1);
  }
  /// The class of a transfer op; `layers`: the program's layer count (largest layer_end). Under
  /// "fifo" it is the caller's: the transfer's start order.
  int class_of(const Op& op, int layers) const;
  /// The strict level (0 most urgent) or weight class of a transfer op that is the
  /// `start_order`-th transfer the run starts (0, 1, ...; below kMaxStarts): its start order
  /// under "fifo", class x kMaxStarts + start order with within_class "fifo", else its class.
  std::int64_t level(const Op& op, int layers, std::int64_t start_order) const;
  static constexpr std::int64_t kMaxStarts = std::int64_t{1} << 40;
  /// The fraction of a transfer that may be dropped: loss_bound for a gradient message, else 0.
  double droppable(const Op& op) const;
  /// Throws config::ValidationError with the offending key's path (relative to the section).
  void validate() const;
};

/// Data-parallel gradient traffic: on the dp_comm stream, a reducing collective (all-reduce,
/// reduce-scatter, reduce) or a point-to-point send outside the forward and optimizer phases (a
/// parameter server's push; its pull, sent in the optimizer phase after the server's update,
/// carries parameters and is not one).
bool is_gradient_message(const Op& op);

/// Reads a `transport` object (strict keys; validate() is the caller's, for the path).
TransportPolicy read_transport(config::ObjectReader r);

}  // namespace stratasim::strategies
