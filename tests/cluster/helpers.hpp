// What the cluster tests share: a run's outputs as one text, and the most GPUs its segments hold
// at once.
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cluster/simulator.hpp"

namespace stratasim::testing {

/// jobs.csv, summary.json and timeline.json, concatenated.
inline std::string outputs(const cluster::ClusterResult& r) {
  std::ostringstream out;
  cluster::write_jobs_csv(out, r);
  cluster::write_summary_json(out, r);
  cluster::write_timeline_json(out, r);
  return out.str();
}

struct Held {
  int most = 0;   // the most GPUs held at any instant
  int final = 0;  // held after the last segment ends (0 when every segment closed)
};

/// GPUs held over time from the segments alone (independently of the utilisation steps).
inline Held gpus_held(const cluster::ClusterResult& r) {
  std::vector<std::pair<double, int>> edges;
  for (const cluster::Segment& s : r.segments) {
    edges.push_back({s.start_s, s.gpus});
    edges.push_back({s.end_s, -s.gpus});
  }
  std::sort(edges.begin(), edges.end());  // releases (negative) before grabs at one time
  Held held;
  for (const auto& [time, delta] : edges) {
    held.final += delta;
    held.most = std::max(held.most, held.final);
  }
  return held;
}

}  // namespace stratasim::testing
