// Properties every pipeline schedule must have, over all schedules and a grid of stages and
// microbatches: the passes make_schedule lists (each unit's F, B, W and R exactly once per chunk
// of its chain, in dependency order, on the device holding the chunk) and the whole path
// (assembled, validated, simulated without deadlock, activations balanced).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "reference/helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "strategies/schedule.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

hw::ClusterSpec free_network_cluster(int devices) {
  return stratasim::testing::pipeline_test_cluster(devices);
}

// The options the grid runs each schedule with: interleaved with 2 virtual stages, terapipe
// with 2 slices per sequence.
ScheduleOptions options_for(ScheduleKind kind) {
  ScheduleOptions o;
  if (kind == ScheduleKind::interleaved) o.virtual_stages = 2;
  if (kind == ScheduleKind::terapipe) o.sequence_slices = 2;
  return o;
}

// Whether the schedule's documented constraints rule (p, m) out.
bool ruled_out(ScheduleKind kind, int p, int m) {
  switch (kind) {
    case ScheduleKind::interleaved:
      return m % p != 0;
    case ScheduleKind::pipedream_2bw:
      return m < p;
    case ScheduleKind::chimera:
      return p % 2 != 0 || m % 2 != 0;
    case ScheduleKind::dualpipe:
      return p % 2 != 0 || m % 2 != 0 || m < 2 * p;
    default:
      return false;
  }
}

const Bytes kStored(1 << 20);      // per chunk and unit, stored by the forward
const Bytes kWeightHeld(1 << 18);  // of it, what a split backward keeps for W

// One plan per part x slice: forward "x.fwd" (+kStored), backward starting with a recompute
// segment and then "x.dgrad" and "x.wgrad" (-kStored; split into B and W by the Zero Bubble
// schedules, kWeightHeld staying for W).
StagePlan test_plan() {
  StagePlan plan;
  Segment f;
  f.kernels = {Kernel{Measured{Time::us(10)}, "x.fwd"}};
  f.label = "forward";
  f.activation_delta = kStored;
  Segment r;
  r.kernels = {Kernel{Measured{Time::us(4)}, "x.recompute"}};
  r.label = "recompute";
  r.recompute = true;
  Segment b;
  b.kernels = {Kernel{Measured{Time::us(12)}, "x.dgrad"}, Kernel{Measured{Time::us(7)}, "x.wgrad"}};
  b.label = "backward";
  b.activation_delta = -kStored;
  b.weight_grad_bytes = kWeightHeld;
  plan.forward = {f};
  plan.backward = {r, b};
  return plan;
}

PipelineSpec test_spec(ScheduleKind kind, int p, int m) {
  PipelineSpec spec;
  spec.layout = RankLayout{1, 1, p};
  spec.schedule = kind;
  spec.schedule_options = options_for(kind);
  spec.microbatches = m;
  const int plans =
      schedule_parts(kind, p, spec.schedule_options) * spec.schedule_options.sequence_slices;
  spec.stages.assign(static_cast<std::size_t>(plans), test_plan());
  return spec;
}

// The chunks unit `unit` runs, first to last.
std::vector<int> chain_of(const Schedule& s, int unit) {
  std::vector<int> chain;
  for (int c = s.first_chunk_of(unit); c >= 0; c = s.next_chunk[static_cast<std::size_t>(c)]) {
    chain.push_back(c);
    if (chain.size() > static_cast<std::size_t>(s.chunks)) break;  // a cycle: caught below
  }
  return chain;
}

// The chunk map: chains that are consistent, cover every part once, and devices in range.
void check_chunk_map(const Schedule& s) {
  const auto n = static_cast<std::size_t>(s.chunks);
  REQUIRE(s.device_of_chunk.size() == n);
  REQUIRE(s.part_of_chunk.size() == n);
  REQUIRE(s.next_chunk.size() == n);
  REQUIRE(s.prev_chunk.size() == n);
  for (int c = 0; c < s.chunks; ++c) {
    const auto i = static_cast<std::size_t>(c);
    CHECK(s.device_of_chunk[i] >= 0);
    CHECK(s.device_of_chunk[i] < s.stages);
    CHECK(s.part_of_chunk[i] >= 0);
    CHECK(s.part_of_chunk[i] < s.parts);
    if (s.next_chunk[i] >= 0) {
      CHECK(s.prev_chunk[static_cast<std::size_t>(s.next_chunk[i])] == c);
      CHECK(s.part_of_chunk[static_cast<std::size_t>(s.next_chunk[i])] == s.part_of_chunk[i] + 1);
    }
    if (s.prev_chunk[i] >= 0) CHECK(s.next_chunk[static_cast<std::size_t>(s.prev_chunk[i])] == c);
  }
  for (int d = 0; d < s.stages; ++d) CHECK_FALSE(s.chunks_of(d).empty());
  CHECK(static_cast<int>(s.carried_backwards.size()) == s.stages);
  if (!s.first_chunk.empty()) CHECK(static_cast<int>(s.first_chunk.size()) == s.units());
  for (int u = 0; u < s.units(); ++u) {
    const auto chain = chain_of(s, u);
    REQUIRE(static_cast<int>(chain.size()) == s.parts);  // every part, in order
    for (int k = 0; k < s.parts; ++k) {
      CHECK(s.part_of_chunk[static_cast<std::size_t>(chain[static_cast<std::size_t>(k)])] == k);
    }
  }
  if (!s.replica_device.empty()) {  // Chimera: every part on two devices, partners symmetric
    REQUIRE(static_cast<int>(s.replica_device.size()) == s.stages);
    for (int d = 0; d < s.stages; ++d) {
      const int partner = s.replica_device[static_cast<std::size_t>(d)];
      CHECK(s.replica_device[static_cast<std::size_t>(partner)] == d);
      std::vector<int> mine, theirs;
      for (int c : s.chunks_of(d)) mine.push_back(s.part_of_chunk[static_cast<std::size_t>(c)]);
      for (int c : s.chunks_of(partner)) {
        theirs.push_back(s.part_of_chunk[static_cast<std::size_t>(c)]);
      }
      std::sort(mine.begin(), mine.end());
      std::sort(theirs.begin(), theirs.end());
      CHECK(mine == theirs);
    }
  }
}

// The passes: each (unit, chunk of its chain) has exactly one F and one B, one W when the
// backward is split, one R with Merak's recompute passes; nothing else. On its device, F comes
// before R before B before W, except PipeDream-2BW's carried backwards (units >= m -
// carried_backwards[d]), run at the start of the iteration for the previous one: B before F.
void check_passes(const Schedule& s) {
  const bool recompute_passes = s.kind == ScheduleKind::merak_scp;
  // (unit, chunk, kind) -> (device, position on the device), and how often it was seen.
  std::map<std::tuple<int, int, int>, std::pair<int, int>> where;
  std::map<std::tuple<int, int, int>, int> seen;
  REQUIRE(static_cast<int>(s.passes.size()) == s.stages);
  for (int d = 0; d < s.stages; ++d) {
    const auto& passes = s.passes[static_cast<std::size_t>(d)];
    for (std::size_t i = 0; i < passes.size(); ++i) {
      const Pass& x = passes[i];
      CAPTURE(d);
      CAPTURE(i);
      REQUIRE(x.chunk >= 0);
      REQUIRE(x.chunk < s.chunks);
      CHECK(s.device_of_chunk[static_cast<std::size_t>(x.chunk)] == d);  // holds its chunk
      REQUIRE(x.microbatch >= 0);
      REQUIRE(x.microbatch < s.units());
      if (x.kind == PassKind::weight) CHECK(s.split_backward);
      if (x.kind == PassKind::recompute) CHECK(recompute_passes);
      const std::tuple<int, int, int> key{x.microbatch, x.chunk, static_cast<int>(x.kind)};
      ++seen[key];
      where[key] = {d, static_cast<int>(i)};
    }
  }
  std::size_t expected_entries = 0;
  for (int u = 0; u < s.units(); ++u) {
    for (int c : chain_of(s, u)) {
      CAPTURE(u);
      CAPTURE(c);
      const int d = s.device_of_chunk[static_cast<std::size_t>(c)];
      const auto at = [&](PassKind k) -> int {
        const std::tuple<int, int, int> key{u, c, static_cast<int>(k)};
        const auto it = seen.find(key);
        CHECK(it != seen.end());
        if (it == seen.end()) return -1;
        CHECK(it->second == 1);
        CHECK(where[key].first == d);
        return where[key].second;
      };
      const int f = at(PassKind::forward), b = at(PassKind::backward);
      expected_entries += 2;
      const int carried_units = s.carried_backwards[static_cast<std::size_t>(d)];
      const bool carried = carried_units > 0 && u >= s.microbatches - carried_units;
      if (carried) {
        CHECK(s.kind == ScheduleKind::pipedream_2bw);
        CHECK(b < f);
      } else {
        CHECK(f < b);
      }
      if (s.split_backward) {
        CHECK(b < at(PassKind::weight));
        ++expected_entries;
      }
      if (recompute_passes) {
        const int r = at(PassKind::recompute);
        CHECK(f < r);
        CHECK(r < b);
        ++expected_entries;
      }
    }
  }
  CHECK(seen.size() == expected_entries);  // no pass outside the units' chains
}

// Largest number of chunk forwards on one device whose backward has not run (B), or with a
// split backward, whose weight pass has not run (what still holds activations).
int peak_in_flight(const Schedule& s, int device) {
  int in_flight = 0, peak = 0;
  const PassKind last = s.split_backward ? PassKind::weight : PassKind::backward;
  for (const Pass& x : s.passes[static_cast<std::size_t>(device)]) {
    if (x.kind == PassKind::forward) ++in_flight;
    if (x.kind == last) --in_flight;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

}  // namespace

TEST_CASE("every schedule: the constraint rules out exactly what it documents") {
  for (auto kind : kAllSchedules) {
    for (int p : {2, 3, 4, 8, 16}) {
      for (int m : {p, 2 * p, 4 * p + 1}) {
        CAPTURE(name_of(kind));
        CAPTURE(p);
        CAPTURE(m);
        const auto problem = schedule_constraint(kind, p, m, options_for(kind));
        CHECK(problem.has_value() == ruled_out(kind, p, m));
        if (problem) {
          CHECK_FALSE(problem->empty());
          CHECK_THROWS_WITH_AS(make_schedule(kind, p, m, options_for(kind)), problem->c_str(),
                               std::invalid_argument);
          CHECK_THROWS_AS(assemble_pipeline(test_spec(kind, p, m)), std::invalid_argument);
        }
      }
    }
  }
  // Options for another schedule are refused.
  CHECK(schedule_constraint(ScheduleKind::one_f_one_b, 4, 8, {2, 1}).has_value());
  CHECK(schedule_constraint(ScheduleKind::interleaved, 4, 8, {2, 2}).has_value());
  CHECK(schedule_constraint(ScheduleKind::gpipe, 4, 8, {1, 2}).has_value());
  CHECK(schedule_constraint(ScheduleKind::one_f_one_b, 0, 8).has_value());
  CHECK(schedule_constraint(ScheduleKind::one_f_one_b, 4, 0).has_value());
}

TEST_CASE("every schedule: each unit's passes once per chunk of its chain, in order, in place") {
  for (auto kind : kAllSchedules) {
    for (int p : {2, 3, 4, 8, 16}) {
      for (int m : {p, 2 * p, 4 * p + 1}) {
        if (ruled_out(kind, p, m)) continue;
        CAPTURE(name_of(kind));
        CAPTURE(p);
        CAPTURE(m);
        const ScheduleOptions o = options_for(kind);
        const Schedule s = make_schedule(kind, p, m, o);
        CHECK(s.kind == kind);
        CHECK(s.stages == p);
        CHECK(s.microbatches == m);
        CHECK(s.slices == o.sequence_slices);
        CHECK(s.parts == schedule_parts(kind, p, o));
        CHECK(s.split_backward == (kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_h2 ||
                                   kind == ScheduleKind::zb_v || kind == ScheduleKind::dualpipe));
        CHECK(s.split_backward == splits_backward(kind));
        CHECK(s.overlapping_iterations ==
              (kind == ScheduleKind::pipedream_2bw || kind == ScheduleKind::zb_h2));
        CHECK(s.weight_versions == (kind == ScheduleKind::pipedream_2bw ? 2 : 1));
        check_chunk_map(s);
        check_passes(s);
        CHECK(pipeline_schedule(kind, p, m, o) == s.passes);
        // zb-v: at most 2p chunk forwards hold activations at a time (schedule.hpp).
        if (kind == ScheduleKind::zb_v) {
          for (int d = 0; d < p; ++d) CHECK(peak_in_flight(s, d) <= 2 * p);
        }
      }
    }
  }
}

TEST_CASE("every schedule: assembled, validated and simulated to the end, activations balanced") {
  // Uniform Measured-kernel plans (see test_plan) on a free network: no deadlock, every unit's
  // forward and backward work run once per chunk of its chain, and each rank's activations go
  // back to what it held before the first op (PipeDream-2BW: the carried units' stash) without
  // ever going negative.
  for (auto kind : kAllSchedules) {
    for (int p : {2, 3, 4, 8, 16}) {
      for (int m : {p, 2 * p, 4 * p + 1}) {
        if (ruled_out(kind, p, m)) continue;
        CAPTURE(name_of(kind));
        CAPTURE(p);
        CAPTURE(m);
        const PipelineSpec spec = test_spec(kind, p, m);
        const Program program = assemble_pipeline(spec);
        REQUIRE_NOTHROW(validate(program));
        CHECK(program.overlapping_iterations() ==
              (kind == ScheduleKind::pipedream_2bw || kind == ScheduleKind::zb_h2));
        const traces::Timeline timeline = sim::simulate(program, free_network_cluster(p));
        REQUIRE_MESSAGE(timeline.completed, timeline.problem);
        CHECK(timeline.out_of_memory.empty());

        // Work: per unit and chunk, forward 10 us, recompute 4 us, backward 12 + 7 us.
        const Schedule s = make_schedule(kind, p, m, spec.schedule_options);
        std::int64_t busy_ps = 0;
        for (const auto& span : timeline.spans) {
          const Op& op = program.op(span.op);
          if (span.stream == Stream::compute &&
              (op.phase == Phase::forward || op.phase == Phase::backward ||
               op.phase == Phase::recompute)) {
            busy_ps += (span.end - span.start).picoseconds();
          }
        }
        const std::int64_t per_unit_chunk = Time::us(10 + 4 + 12 + 7).picoseconds();
        CHECK(busy_ps == per_unit_chunk * s.units() * s.parts);

        // Activations: back to the initial state, never below zero.
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          Bytes initial;
          for (const auto& held : program.initial_memory(r)) {
            if (held.tier == MemoryTier::device) initial += held.bytes;
          }
          const int carried = s.carried_backwards[static_cast<std::size_t>(r)];
          CHECK(initial == kStored * carried);
          Bytes last = initial;
          Bytes lowest = initial;
          for (const auto& sample : timeline.memory) {
            if (sample.rank != r || sample.tier != MemoryTier::device) continue;
            last = sample.total;
            lowest = std::min(lowest, sample.total);
          }
          CHECK(last == initial);
          CHECK(lowest >= Bytes(0));
        }

        traces::ReportContext context;
        context.device_peak = FlopRate(100e12);
        context.device_capacity = Bytes(80LL << 30);
        const auto report = traces::make_report(program, timeline, context);
        CHECK(report.completed);
        CHECK(report.pipeline_time_s > 0);
        CHECK(report.bubble_fraction >= 0);
        CHECK(report.bubble_fraction < 1);
      }
    }
  }
}
