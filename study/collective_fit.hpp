// The published collective sweeps of the calibration set (category "collective") as points the
// NCCL-structured model (sim/nccl_model.hpp) is compared with (study/accuracy.hpp's collective
// table) and fitted to (`stratasim fit --collectives`, scripts/fit-profiles).
//
// Mapping (docs/accuracy.md): a case's system (hardware.system / hardware.gpu, nodes) names a
// shipped cluster (kCollectiveSystems in collective_fit.cpp); its ranks are the cluster's first
// config.ranks devices. A sweep ("measured.sweep") gives one point per size; a single
// measurement (busbw_GBps at config.size_bytes) one point, and its busbw_nvls_off_GBps a second
// one with the ring fixed (NCCL_NVLS_ENABLE=0), as does a variant that says NCCL_NVLS_ENABLE=0.
// The published time is the smaller of nccl-tests' out-of-place and in-place times (the same
// collective twice); the published busbw is recomputed from it (nccl-tests prints busbw to
// 0.01 GB/s, too coarse for small sizes) with nccl-tests' factor; where only a busbw is
// printed, the time is derived from it. send/recv (sendrecv_perf: every rank sends S to the
// next and receives S from the previous at once) is a point-to-point transfer of S; busbw = S / t.
// A point whose time exceeds kDisturbedFactor times that of a larger size of the same sweep is
// left out as disturbed (time falls as size grows: no cost that grows with size can come
// within 25% of both).
//
// Fit: which parameter is a property of what (never of a case or a point):
// - intra-node fabric (hw::NcclFabric, a device generation's NVLink and switch): efficiency,
//   channel_busbw and its ring step latency of each protocol (LL, LL128, Simple; the tree's
//   follow by NCCL's tree/ring proportions, sim::nccl_tree_step_latency) where it has
//   collective points; nvls.efficiency and nvls.latency where it has NVLS; p2p_efficiency (and
//   p2p_channel_bandwidth where the fabric gives one) where it has send/recv points;
// - network fabric: efficiency, its hop latency for LL and LL128 (where it runs either), and
//   its hop latency for Simple (NCCL's NET hwLat differs by protocol; Simple pays its hop
//   twice, for the flush), where it has points spanning nodes;
// - measuring tool (tools.json beside the fabrics): the fixed time the tool adds to every call
//   (all_reduce_bench.py times torch.distributed calls from Python), where a tool other than
//   nccl-tests has points.
// Objective: the sum over the points kept of |ln(predicted / published busbw)| (least absolute
// deviations, so that one disturbed point the rule above keeps pulls less), plus kGatePenalty
// times each point's relative error beyond 0.95 of its gate bound (study::collective_bound), and
// a faint pull of the NVLink step latencies toward NCCL's hwLat (kPriorWeight), predicted by
// the NCCL model alone (no contention) plus the tool's overhead. Nelder-Mead over logits of
// fractions and logarithms of latencies, restarted until it stops improving.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/cluster.hpp"
#include "strategies/program.hpp"

namespace stratasim::study {

inline constexpr double kDisturbedFactor = 1.25;
/// The fit's objective adds this many times a point's relative error beyond its gate bound
/// (study::collective_bound): least absolute deviations alone do not care which of two points
/// it cannot both fit lies outside the bound.
inline constexpr double kGatePenalty = 10.0;
/// ... counted from this fraction of the bound, so that a point the fit can keep inside does
/// not end on its edge.
inline constexpr double kGateMargin = 0.95;
/// ... plus this many times |ln(value / NCCL's figure)| of each NVLink step latency, so that a
/// step latency no point's chosen candidate pays stays at NCCL's hwLat instead of drifting.
inline constexpr double kPriorWeight = 1e-3;

/// One published point of a collective sweep.
struct CollectivePoint {
  std::string id;       // "<case id>/<size in bytes>", "+ring" where the ring was fixed
  std::string case_id;  // the calibration case
  std::string source;   // its source.ref
  std::string series;   // what the notebook plots together: the case id (ring-fixed: + " ring")
  std::string system;   // hardware.system (or gpu) as the case gives it
  std::string cluster;  // the shipped cluster it maps to (catalog name); empty: none
  std::string tool;     // config.tool, '.' written '_' (the key of tools.json)
  bool p2p = false;     // send/recv
  strategies::CollectiveKind kind = strategies::CollectiveKind::all_reduce;
  hw::CollectiveAlgorithm fixed = hw::CollectiveAlgorithm::automatic;
  int ranks = 0;
  Bytes bytes;
  double published_seconds = 0;
  double published_busbw = 0;  // bytes/s
  std::string excluded;        // non-empty: left out, and why
};

/// The points of every "collective" case of `calibration`. Throws config::ConfigError naming
/// the file and JSON path of a malformed field.
std::vector<CollectivePoint> collective_points(const std::filesystem::path& calibration);

/// The time the measuring tool adds to every call, by CollectivePoint::tool, from
/// <fabrics dir>/tools.json: {"tools": {name: {"overhead": "30 us", "fitted_to": [...]}}}.
std::map<std::string, Time> tool_overheads(const std::filesystem::path& fabrics_dir);

struct CollectivePrediction {
  Time time;
  double busbw = 0;  // bytes/s, nccl-tests' factor
  hw::CollectiveAlgorithm algorithm = hw::CollectiveAlgorithm::ring;
  std::optional<hw::NcclProtocol> protocol;
};

/// A point on `cluster` (its ranks the first point.ranks devices) through the cluster's network
/// model (sim::measure_collective, or the point-to-point time), plus `overhead`.
CollectivePrediction predict(const CollectivePoint& point, const hw::ClusterSpec& cluster,
                             Time overhead);

/// What the fit found for one fabric or tool.
struct FabricFit {
  std::string name;                      // fabric (file stem under the fabrics dir) or tool
  std::map<std::string, double> values;  // fitted field -> value (latencies in seconds)
  std::vector<std::string> cases;        // the calibration cases it was fitted to
  int points = 0;
  double mean_abs_error = 0;  // over its points, after the fit
  double max_abs_error = 0;
};

/// Fits the fabrics (and tools) of the shipped clusters the points map to, and rewrites their
/// files in `fabrics_dir` (<name>.json: fitted fields, "fitted_to" and "fit"; tools.json).
/// Throws BadInput when a mapped cluster has no NCCL model, or the fit does not converge.
std::vector<FabricFit> fit_collectives(const std::filesystem::path& calibration,
                                       const std::filesystem::path& fabrics_dir,
                                       int max_evaluations = 20000);

}  // namespace stratasim::study
