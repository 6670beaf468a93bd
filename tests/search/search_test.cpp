// The strategy search: its space, memory pruning (sound: a pruned strategy does not fit when
// simulated), the objectives' order and the Pareto frontier.
#include <doctest/doctest.h>

#include "search/search.hpp"

using namespace stratasim;
using namespace stratasim::search;

namespace {
const std::string kConfigs = std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/";
}

TEST_CASE("the search space: tp inside a node, pp powers of two, dp the GPUs left") {
  const auto e = strategies::load_experiment(kConfigs + "gpt3-1.7b-a100-8.json");
  SearchSpace s;
  s.gpus = 8;
  const auto combos = search_space(e, s);
  // (tp, pp) with tp * pp <= 8, both powers of two, tp <= 8 devices per node:
  // (1,1) (1,2) (1,4) (1,8) (2,1) (2,2) (2,4) (4,1) (4,2) (8,1) = 10 pairs; the 6 with dp > 1
  // take 4 ZeRO stages, the 4 with dp = 1 ((1,8) (2,4) (4,2) (8,1)) only stage 0 (ZeRO shards
  // over dp); each times 3 recomputations and 3 micro-batch sizes.
  CHECK(combos.size() == (6 * 4 + 4) * 3 * 3);
  for (const auto& c : combos) {
    CHECK(c.tp * c.pp * c.dp == 8);
    CHECK(c.gpus == 8);
    // the schedule and its knobs stay the experiment's
    CHECK(c.schedule.empty());
    CHECK(c.sequence_parallel == -1);
    CHECK(c.virtual_stages == 0);
    CHECK(c.sequence_slices == 0);
  }
  // The cost objective also tries 4 and 2 GPUs (down to a quarter by default): 6 more pairs on
  // 4 GPUs (3 with dp > 1, 3 with dp = 1) and 3 on 2 GPUs (1 and 2); down to 1 GPU, (1,1) with
  // dp = 1 more.
  s.fewer_gpus = true;
  CHECK(search_space(e, s).size() == ((6 + 3 + 1) * 4 + (4 + 3 + 2)) * 3 * 3);
  s.min_gpus = 1;
  CHECK(search_space(e, s).size() == ((6 + 3 + 1) * 4 + (4 + 3 + 2 + 1)) * 3 * 3);
  for (const auto& c : search_space(e, s)) {
    if (c.dp == 1) CHECK(c.zero == 0);
  }
  s.fewer_gpus = false;
  s.gpus = 12;  // neither whole nodes of 8 nor part of one
  CHECK_THROWS_AS(search_space(e, s), std::invalid_argument);
}

TEST_CASE("the search space with context parallelism (opt in)") {
  const auto e = strategies::load_experiment(kConfigs + "gpt3-1.7b-a100-8.json");
  SearchSpace s;
  s.gpus = 8;
  s.zero = {0};
  s.recompute = {"none"};
  s.micro_batch = {1};
  s.cp = {1, 2};
  const auto combos = search_space(e, s);
  // (tp, pp, cp) powers of two with tp * pp * cp dividing 8: cp 1 gives the 10 (tp, pp) pairs of
  // the test above; cp 2 those with tp * pp <= 4: (1,1) (1,2) (1,4) (2,1) (2,2) (4,1) = 6.
  CHECK(combos.size() == 10 + 6);
  int with_cp = 0;
  for (const auto& c : combos) {
    CHECK(c.tp * c.pp * c.cp * c.dp == 8);
    with_cp += c.cp == 2 ? 1 : 0;
  }
  CHECK(with_cp == 6);
  // Without the axis every combination keeps the experiment's cp (cp 0: not overridden).
  s.cp.clear();
  for (const auto& c : search_space(e, s)) CHECK(c.cp == 0);
}

TEST_CASE("the search space with schedules, virtual stages, sequence parallelism and FSDP") {
  const auto e = strategies::load_experiment(kConfigs + "gpt3-1.7b-a100-8.json");  // 24 layers
  SearchSpace s;
  s.gpus = 8;
  s.schedules = {"1f1b", "interleaved"};
  s.virtual_stages = {2, 4};
  s.sequence_parallel = {0, 1};
  s.fsdp = true;
  const auto combos = search_space(e, s);
  // Per (tp, pp) pair, by hand (24 layers; schedule entries 1f1b, interleaved x2, x4):
  //   schedules: pp 1 -> 1 (interleaved needs pp > 1); pp 2 -> 3 (24 % 4, 24 % 8 == 0);
  //              pp 4 -> 2 (24 % 8 == 0, 24 % 16 != 0); pp 8 -> 1 (24 % 16, 24 % 32 != 0)
  //   sequence parallelism: tp 1 -> 1 (off only), tp > 1 -> 2
  //   sharding: dp > 1 -> 4 ZeRO stages, + FSDP when pp 1; dp 1 -> 1
  //   (1,1) dp 8: 1*1*5 = 5    (1,2) dp 4: 3*1*4 = 12   (1,4) dp 2: 2*1*4 = 8
  //   (1,8) dp 1: 1*1*1 = 1    (2,1) dp 4: 1*2*5 = 10   (2,2) dp 2: 3*2*4 = 24
  //   (2,4) dp 1: 2*2*1 = 4    (4,1) dp 2: 1*2*5 = 10   (4,2) dp 1: 3*2*1 = 6
  //   (8,1) dp 1: 1*2*1 = 2    sum 82, each times 3 recomputations and 3 micro-batch sizes.
  CHECK(combos.size() == 82 * 3 * 3);
  int interleaved = 0, fsdp = 0, sp = 0;
  for (const auto& c : combos) {
    CHECK(c.tp * c.pp * c.dp == 8);
    CHECK(!excluded_because(e, s, c));
    if (c.schedule == "interleaved") {
      ++interleaved;
      CHECK(c.pp > 1);
      CHECK(24 % (c.pp * c.virtual_stages) == 0);
    } else {
      CHECK(c.schedule == "1f1b");
      CHECK(c.virtual_stages == 1);
    }
    if (c.framework == "fsdp") {
      ++fsdp;
      CHECK(c.pp == 1);
      CHECK(c.zero == 3);  // FULL_SHARD keeps ZeRO-3's model states
    }
    if (c.sequence_parallel == 1) {
      ++sp;
      CHECK(c.tp > 1);
    }
  }
  // interleaved: (1,2) x2,x4: 2*4; (1,4) x2: 1*4; (2,2): 2*2*4; (2,4): 1*2*1; (4,2): 2*2*1
  //   = 8 + 4 + 16 + 2 + 4 = 34 points; FSDP: (1,1) (2,1)x2 sp (4,1)x2 sp = 5 points;
  // sequence parallelism on: half the tp > 1 points, (10 + 24 + 4 + 10 + 6 + 2) / 2 = 28.
  CHECK(interleaved == 34 * 9);
  CHECK(fsdp == 5 * 9);
  CHECK(sp == 28 * 9);

  // The reasons for what is left out.
  auto why = [&](Combination c) { return excluded_because(e, s, c).value_or(""); };
  auto point = [](int tp, int pp, int dp, int zero = 0) {
    Combination p;
    p.tp = tp;
    p.pp = pp;
    p.dp = dp;
    p.zero = zero;
    return p;
  };
  Combination c = with_schedule(point(1, 2, 4), strategies::ScheduleKind::one_f_one_b, 1);
  c.sequence_parallel = 1;
  CHECK(why(c) == "sequence parallelism needs tp > 1");
  c = with_schedule(point(2, 4, 1), strategies::ScheduleKind::interleaved, 4);
  CHECK(why(c) == "layers (24) not divisible by pp x virtual stages (4 x 4)");
  c = with_schedule(point(2, 1, 4), strategies::ScheduleKind::interleaved, 2);
  CHECK(why(c) == "the interleaved schedule needs pp > 1");
  c = with_schedule(point(2, 2, 2, 3), strategies::ScheduleKind::one_f_one_b, 1);
  c.framework = "fsdp";
  CHECK(why(c) == "FSDP needs pp 1 (its runtime is modelled without a pipeline)");
  c.pp = 1;
  c.dp = 4;
  CHECK(why(c).empty());
  c.tp = 8;
  c.dp = 1;
  CHECK(why(c) == "FSDP needs dp > 1 (nothing to shard)");

  // Bad values name the flag.
  CHECK_THROWS_WITH_AS(parse_schedules("1f1b,gpipe2", "--schedules"),
                       doctest::Contains("--schedules"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_virtual_stages("1,2", "--interleave"),
                       doctest::Contains("--interleave"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_sequence_parallel("0,2", "--sequence-parallel"),
                       doctest::Contains("--sequence-parallel"), std::invalid_argument);
}

TEST_CASE("a strategy pruned by memory does not fit when simulated") {
  // The 1.7B GPT on 8 GPUs with 16 GiB each: without ZeRO its model states (16 bytes per
  // parameter, 1.7e9 * 16 = 27 GB) exceed a device, so the cheap check prunes them; with ZeRO
  // large micro batches run out of memory on activations, which the estimate prunes.
  const std::vector<strategies::Override> small_device = {
      {"cluster.device.memory.capacity", "16 GiB", "test"}};
  const Evaluator pruning(kConfigs + "gpt3-1.7b-a100-8.json", small_device, {.prune = true});
  const Evaluator full(kConfigs + "gpt3-1.7b-a100-8.json", small_device);
  SearchSpace s;
  s.gpus = 8;
  const auto combos = search_space(pruning.base(), s);
  int by_states = 0, by_estimate = 0, checked_ok = 0;
  for (const auto& c : combos) {
    const Result r = pruning.evaluate(c);
    if (r.status == Status::oom && !r.simulated) {
      const bool states = r.reason.find("model states") != std::string::npos;
      int& count = states ? by_states : by_estimate;
      if (++count > 2) continue;  // a few of each kind are enough
      CAPTURE(r.reason);
      const Result simulated = full.evaluate(c);
      CHECK(simulated.simulated);
      CHECK(simulated.status == Status::oom);
      CHECK_FALSE(simulated.fits);
      CHECK(simulated.peak_memory_bytes > simulated.capacity_bytes);
      // The pruning figure is a lower bound of the simulated peak.
      CHECK(r.peak_memory_bytes <= simulated.peak_memory_bytes);
    } else if (r.status == Status::ok && checked_ok < 3) {
      ++checked_ok;  // pruning changes nothing for those it keeps
      const Result simulated = full.evaluate(c);
      CHECK(simulated.iteration_time_s == r.iteration_time_s);
      CHECK(simulated.peak_memory_bytes == r.peak_memory_bytes);
    }
  }
  CHECK(by_states > 0);
  CHECK(by_estimate > 0);
  CHECK(checked_ok == 3);
}

TEST_CASE("objectives order the feasible strategies") {
  auto result = [](double tokens, int gpus, std::int64_t peak, Status status) {
    Result r;
    r.tokens_per_s = tokens;
    r.gpus = gpus;
    r.peak_memory_bytes = peak;
    r.status = status;
    r.iteration_time_s = 1e6 / tokens;
    return r;
  };
  const std::vector<Result> results = {
      result(100, 8, 50, Status::ok),   // A: cost 8 / 100 = 0.08 GPU-s per token
      result(150, 16, 40, Status::ok),  // B: 16 / 150 = 0.107
      result(90, 4, 60, Status::ok),    // C: 4 / 90 = 0.044
      result(500, 8, 10, Status::oom),  // D: does not fit, never ranked
      result(100, 8, 50, Status::ok),   // E: ties with A: after it (enumeration order)
      result(100, 8, 45, Status::ok),   // F: as fast as A with less memory: before it
  };
  CHECK(rank_by(Objective::throughput, results) == std::vector<std::size_t>{1, 5, 0, 4, 2});
  CHECK(rank_by(Objective::memory, results) == std::vector<std::size_t>{1, 5, 0, 4, 2});
  CHECK(rank_by(Objective::cost, results) == std::vector<std::size_t>{2, 5, 0, 4, 1});
  CHECK(objective_from_name("cost") == Objective::cost);
  CHECK_FALSE(objective_from_name("speed").has_value());
}

TEST_CASE("the Pareto frontier of time vs memory on a hand-made set") {
  const std::vector<Point> points = {
      {1, 10, true},  // 0: fastest: on the frontier
      {2, 5, true},   // 1: on
      {3, 6, true},   // 2: dominated by 1 (slower and more memory)
      {4, 1, true},   // 3: least memory: on
      {2, 5, true},   // 4: equal to 1: neither dominates, both on
      {5, 1, true},   // 5: dominated by 3 (same memory, slower)
      {0, 0, false},  // 6: not feasible: left out although it would dominate all
      {2, 7, true},   // 7: dominated by 1 (same time, more memory)
  };
  CHECK(pareto_frontier(points) ==
        std::vector<bool>{true, true, false, true, true, false, false, false});
  CHECK(pareto_frontier({}).empty());
}
