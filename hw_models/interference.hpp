// Compute-communication interference on one GPU: what a collective or message running on a
// device costs the kernels that run beside it, and what they cost it. A cluster's
// `interference` section (docs/network.md, "Interference") holds the figures; sim/simulator.cpp
// applies them as rates (a kernel list or a transfer progresses at a share of its own speed while
// the other runs), so turning the section off ("enabled": false) gives back the times of a model
// where overlap is free.
//
// The mechanism, from the way NCCL runs:
// - NCCL launches one thread block per channel, each holding one SM for the whole collective, so
//   compute-bound kernels (GEMMs, fused attention) beside it have `communication_units` fewer SMs:
//   their rate is f_sm = 1 - communication_units / compute_units. A transfer whose op says
//   otherwise (strategies::Collective::sms, Send::sms) holds that many instead: Transformer
//   Engine's userbuffers kernels their num_sm, a copy-engine transfer none (f_sm = 1); a rank
//   with several transfers at once loses the SMs of the one holding most
//   (sim/interference_tracker.hpp).
// - NCCL's kernels move every byte they send or receive through device memory more than once
//   (read the user buffer, write and read the FIFO of the peer's connection, write the result):
//   NCCL's maintainers put it at 2 to 3 times the link's rate (NVIDIA/nccl#1428, #1433). A
//   transfer over a link of bandwidth L demands D = memory_traffic_per_byte x L of the device
//   memory's achievable bandwidth B. Memory-bound kernels (elementwise, norms, the optimizer,
//   copies) beside it demand all of B; sharing in proportion to demand, they run at
//   f_hbm = B / (B + D) and so does the transfer, while they run.
// - A kernel list of on-device compute-bound work T_c, memory-bound work T_m and unaffected time
//   T_u (launch overheads, host and PCIe work) then takes T_u + T_c / f_sm + T_m / f_hbm: its
//   rate is T / that.
// - A transfer runs at full speed while its members run compute-bound kernels and at f_hbm while
//   they run memory-bound ones; with m = T_m / T of what a member computes, its rate is
//   1 / ((1 - m) + m / f_hbm). The slowest member paces a collective: it takes the mean m of the
//   members that compute (one member computing is enough to slow it).
#pragma once

#include "hw_models/config_reader.hpp"
#include "hw_models/units.hpp"

namespace stratasim::hw {

struct InterferenceSpec {
  /// False: communication and compute overlap for free (the model before interference).
  bool enabled = true;
  /// SMs the communication kernels hold while a transfer of the device runs: NCCL's channel
  /// count (one thread block, one SM per channel). >= 0. The cluster's
  /// collectives.max_channels (NCCL_MAX_NCHANNELS) caps it: hw::communication_units().
  int communication_units = 16;
  /// Device-memory bytes moved per byte a transfer moves over its link (NCCL: 2 to 3). >= 0.
  double memory_traffic_per_byte = 3.0;
  /// The flow-level network's transfers slow too (their flows are capped at the transfer's rate
  /// times what they would get alone, sim/flow_network.hpp). Off: only compute is slowed there,
  /// as before the option existed (the analytical network always slows transfers).
  bool flow_transfers = false;

  /// Throws config::ValidationError ("interference.communication_units").
  void validate() const;
};

/// Reads an `interference` object: {"enabled", "communication_units",
/// "memory_traffic_per_byte", "flow_transfers"}.
InterferenceSpec read_interference(config::ObjectReader reader);

/// The shares of a kernel list's time that interference can slow (see above), each in [0, 1]
/// and summing to at most 1.
struct WorkMix {
  double compute_bound = 0;
  double memory_bound = 0;
};

/// f_sm: the rate of compute-bound kernels while communication holds `units` of the device's
/// `compute_units` SMs, at least 1 / compute_units.
double compute_units_rate(int units, int compute_units);
/// f_hbm: the rate of memory-bound work (and of a transfer) when a transfer demands `demand` of
/// the achievable memory bandwidth `memory`, B / (B + D).
double memory_share_rate(Bandwidth demand, Bandwidth memory);
/// A kernel list's rate beside communication: 1 / (u + c / f_sm + m / f_hbm), u = 1 - c - m.
double compute_rate(const WorkMix& mix, double f_sm, double f_hbm);
/// A transfer's rate while members compute with memory-bound share `memory_bound`:
/// 1 / ((1 - m) + m / f_hbm).
double transfer_rate(double memory_bound, double f_hbm);

}  // namespace stratasim::hw
