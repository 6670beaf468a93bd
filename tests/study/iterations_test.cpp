// Several iterations back to back (strategies/iterations.hpp) and the parameter-server strategy
// (docs/parameter-server.md), simulated. Expected values are worked by hand in each case's
// comment from the ops' durations and the network's p2p formula (sim/network.hpp: latency +
// bytes / bandwidth on the analytical network).
#include <doctest/doctest.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiment_helpers.hpp"
#include "strategies/iterations.hpp"
#include "strategies/layer_table.hpp"
#include "study/study.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"
#include "traces/report.hpp"

namespace stratasim::testing {
namespace {

using namespace strategies;

OpId add_measured(Program& p, std::uint32_t kernels, Stream stream, Phase phase, int layer,
                  std::span<const OpId> deps = {}) {
  OpInfo info{
      stream, phase, -1, static_cast<std::int16_t>(layer), static_cast<std::int16_t>(layer + 1),
      "op"};
  (void)kernels;
  return p.add(Compute{kernels}, info, deps);
}

// A two-layer model on one rank: forward f0, f1 (10 us each) and backward b1, b0 (20 us each)
// on the compute stream; layer 1's update u1 (50 us, host stream) after b1, layer 0's update u0
// (5 us, copy stream) after b0.
Program two_layers() {
  Program p(1);
  const auto k10 = p.add_kernels({Kernel{Measured{Time::us(10)}, "f"}});
  const auto k20 = p.add_kernels({Kernel{Measured{Time::us(20)}, "b"}});
  const auto k50 = p.add_kernels({Kernel{Measured{Time::us(50)}, "u1"}});
  const auto k5 = p.add_kernels({Kernel{Measured{Time::us(5)}, "u0"}});
  p.begin_rank(0);
  add_measured(p, k10, Stream::compute, Phase::forward, 0);
  add_measured(p, k10, Stream::compute, Phase::forward, 1);
  const std::array<OpId, 1> b1 = {add_measured(p, k20, Stream::compute, Phase::backward, 1)};
  const std::array<OpId, 1> b0 = {add_measured(p, k20, Stream::compute, Phase::backward, 0)};
  add_measured(p, k50, Stream::host, Phase::optimizer, 1, b1);
  add_measured(p, k5, Stream::copy, Phase::optimizer, 0, b0);
  p.finish();
  return p;
}

traces::Report report_of(const Program& p, traces::Timeline* out = nullptr) {
  const hw::ClusterSpec cluster = test_cluster(1, 1);
  traces::Timeline t = study::simulate_program(p, cluster, sim::SimOptions{});
  REQUIRE(t.completed);
  traces::ReportContext context;
  context.samples_per_iteration = 10;
  traces::Report r = traces::make_report(p, t, context);
  if (out != nullptr) *out = std::move(t);
  return r;
}

Time start_of(const traces::Timeline& t, OpId op) {
  for (const auto& s : t.spans) {
    if (s.op == op) return s.start;
  }
  FAIL("no span for op " << op);
  return Time();
}

}  // namespace

TEST_CASE("iterations: the next forward of a layer waits for that layer's update only") {
  // One iteration, by hand: f0 0-10, f1 10-20, b1 20-40, b0 40-60 us; u1 40-90 (host), u0
  // 60-65 (copy): 90 us.
  const Program one = two_layers();
  CHECK(report_of(one).iteration_time_s == doctest::Approx(90e-6).epsilon(1e-12));
  // Two iterations: iteration 2's f0 waits for b0 (compute stream, 60) and u0 (65): 65-75,
  // before iteration 1's u1 ends (90); f1 waits for u1: 90-100; b1 100-120; b0 120-140; u1
  // 120-170 (host, after b1); u0 140-145. Total 170 us, ends 90 and 170, mean 85 us. A barrier
  // between the iterations would start f0 at 90 and end at 180.
  const Program two = repeat_iterations(one, 2);
  REQUIRE(two.iterations() == 2);
  REQUIRE(two.op_count() == 2 * one.op_count());
  traces::Timeline timeline;
  const traces::Report r = report_of(two, &timeline);
  CHECK(start_of(timeline, 6) == Time::us(65));  // iteration 2's f0
  CHECK(start_of(timeline, 7) == Time::us(90));  // iteration 2's f1
  CHECK(r.iterations == 2);
  CHECK(r.total_time_s == doctest::Approx(170e-6).epsilon(1e-12));
  CHECK(r.iteration_time_s == doctest::Approx(85e-6).epsilon(1e-12));
  REQUIRE(r.iteration_end_s.size() == 2);
  CHECK(r.iteration_end_s[0] == doctest::Approx(90e-6).epsilon(1e-12));
  CHECK(r.iteration_end_s[1] == doctest::Approx(170e-6).epsilon(1e-12));
  // Throughput per mean iteration: 10 samples / 85 us.
  CHECK(r.samples_per_s == doctest::Approx(10 / 85e-6));
}

TEST_CASE("iterations: an update without a layer range holds every layer's next forward") {
  // The same model with one optimizer step for both layers (layer range -1, 50 us on the host
  // stream after b0): iteration 1 ends with the step at 60-110; iteration 2's f0 waits for it:
  // f0 110-120, f1 120-130, b1 130-150, b0 150-170, step 170-220. Total 220 us, mean 110.
  Program p(1);
  const auto k10 = p.add_kernels({Kernel{Measured{Time::us(10)}, "f"}});
  const auto k20 = p.add_kernels({Kernel{Measured{Time::us(20)}, "b"}});
  const auto k50 = p.add_kernels({Kernel{Measured{Time::us(50)}, "step"}});
  p.begin_rank(0);
  add_measured(p, k10, Stream::compute, Phase::forward, 0);
  add_measured(p, k10, Stream::compute, Phase::forward, 1);
  add_measured(p, k20, Stream::compute, Phase::backward, 1);
  const std::array<OpId, 1> b0 = {add_measured(p, k20, Stream::compute, Phase::backward, 0)};
  p.add(Compute{k50}, OpInfo{Stream::host, Phase::optimizer, -1, -1, -1, "step"}, b0);
  p.finish();
  const traces::Report r = report_of(repeat_iterations(p, 2));
  CHECK(r.total_time_s == doctest::Approx(220e-6).epsilon(1e-12));
  CHECK(r.iteration_time_s == doctest::Approx(110e-6).epsilon(1e-12));
}

TEST_CASE("iterations: refused where a schedule overlaps iterations itself, or out of range") {
  Program p = two_layers();
  CHECK_THROWS_AS(repeat_iterations(p, 0), std::invalid_argument);
  CHECK_THROWS_AS(repeat_iterations(p, kMaxIterations + 1), std::invalid_argument);
  CHECK_THROWS_AS(repeat_iterations(repeat_iterations(p, 2), 2), std::invalid_argument);
  p.set_overlapping_iterations(true);
  CHECK_THROWS_AS(repeat_iterations(p, 2), std::invalid_argument);
}

namespace {

// A layer-table model of `layers` layers of `params` parameters each, with measured times:
// forward 1 ms, input gradient 2 ms, weight gradient 3 ms per layer (micro-batch of 1).
std::filesystem::path write_model(const TempDir& dir, int layers, std::int64_t params) {
  nlohmann::json rows = nlohmann::json::array();
  for (int l = 0; l < layers; ++l) {
    rows.push_back({{"name", "l" + std::to_string(l)},
                    {"params", params},
                    {"forward_time", "1 ms"},
                    {"backward_input_time", "2 ms"},
                    {"backward_weight_time", "3 ms"},
                    {"activation_bytes", "1 MiB"},
                    {"output_bytes", "1 MiB"},
                    {"weight_grad_bytes", "0 B"}});
  }
  const nlohmann::json model = {
      {"type", "layers"}, {"name", "tiny"}, {"batch", 1}, {"layers", rows}};
  const auto path = dir.path() / "tiny.json";
  std::ofstream(path) << model.dump(2);
  return path;
}

// W workers and S servers, one device per node, 10 GB/s and 10 us between nodes (analytical),
// fp32 training with SGD (no loss scaling; gradients and parameters of 4 bytes).
Experiment ps_experiment(const TempDir& dir, int layers, std::int64_t params, int workers,
                         int servers, std::int64_t slice = 0) {
  const nlohmann::json cluster = {
      {"name", "ps-test"},
      {"nodes", workers + servers},
      {"devices_per_node", 1},
      {"device", (configs_dir() / "hardware/devices/v100-sxm2-32gb.json").string()},
      {"intra_node", {{"bandwidth", "100 GB/s"}, {"latency", "1 us"}}},
      {"inter_node", {{"bandwidth", "10 GB/s"}, {"latency", "10 us"}}}};
  const nlohmann::json e = {
      {"name", "ps"},
      {"model", write_model(dir, layers, params).string()},
      {"cluster", cluster},
      {"parallelism",
       {{"dp", workers},
        {"data_parallel", "parameter_server"},
        {"servers", servers},
        {"slice_parameters", slice}}},
      {"training",
       {{"global_batch", workers}, {"seq_len", 1}, {"dtype", "fp32"}, {"optimizer", "sgd"}}}};
  const auto path = dir.path() / "ps.json";
  std::ofstream(path) << e.dump(2);
  return load_experiment(path, {});
}

// The duration of the first span of an op labelled `label`.
Time span_of(const study::Result& r, const std::string& label) {
  for (const auto& s : r.timeline.spans) {
    if (r.program.label_of(r.program.op(s.op)) == label) return s.end - s.start;
  }
  FAIL("no span labelled " << label);
  return Time();
}

}  // namespace

TEST_CASE("parameter server, one layer: forward, backward, push, sum and step, pull") {
  const TempDir dir("ps-one-layer");
  // One layer of 25M fp32 parameters: 100 MB each way. Two workers. Each worker: forward 1 ms,
  // backward 2 + 3 = 5 ms, push at 6 ms. The pushes are detached sends, both in flight at once;
  // the analytical network times each message alone: 10 us + 100e6 / 10e9 s = 10.01 ms, so both
  // arrive at 16.01 ms. The server's update (sum of the two gradients and the SGD step, the cost
  // model's) takes U; its two pulls, detached too, arrive 10.01 ms later: 6 + 10.01 + U + 10.01.
  const std::int64_t params = 25'000'000;
  const Experiment e = ps_experiment(dir, 1, params, 2, 1);
  study::Options options;
  const study::Result r = study::simulate(e, options);
  REQUIRE(r.finished());
  REQUIRE(r.program.world_size() == 3);
  const double message = 10e-6 + 100e6 / 10e9;
  const double update = span_of(r, "ps update L0").seconds();
  CHECK(update > 0);
  CHECK(span_of(r, "l0").seconds() == doctest::Approx(1e-3));
  CHECK(r.report.iteration_time_s ==
        doctest::Approx(6e-3 + message + update + message).epsilon(1e-9));
}

TEST_CASE("parameter server: pushes and pulls move 2 x the parameters' bytes per worker") {
  // VGG-16 (138,357,544 parameters, configs/models/layers/vgg16-layers.json), fp16: each worker
  // pushes 2 bytes per parameter and pulls 2 bytes per parameter in each iteration, whatever the
  // sharding over servers: 2 x 2 x 138,357,544 = 553,430,176 bytes; with 3 iterations, 3 times
  // that over the run. Every push and pull carries one layer's range; every Send is on dp-comm.
  const Experiment e = load_experiment(configs_dir() / "experiments/vgg16-ps-v100-10.json", {});
  REQUIRE(e.layer_table);
  const std::int64_t params = e.layer_table->parameters();
  CHECK(params == 138'357'544);
  for (int n : {1, 3}) {
    CAPTURE(n);
    const Program p = study::lower(e, {.iterations = n});
    const int workers = 8;
    REQUIRE(p.world_size() == workers + 2);
    for (int w = 0; w < workers; ++w) {
      std::int64_t pushed = 0, pulled = 0;
      for (const Op& op : p.ops_of(w)) {
        if (const auto* s = std::get_if<Send>(&op.work)) {
          CHECK(op.stream == Stream::dp_comm);
          CHECK(op.layer_end == op.layer_begin + 1);
          pushed += s->bytes.count();
        } else if (const auto* rv = std::get_if<Recv>(&op.work)) {
          CHECK(op.layer_end == op.layer_begin + 1);
          CHECK(op.phase == Phase::optimizer);
          pulled += rv->bytes.count();
        }
      }
      CHECK(pushed == n * 2 * params);
      CHECK(pulled == n * 2 * params);
    }
    for (int s = workers; s < workers + 2; ++s) {
      for (const Op& op : p.ops_of(s)) {
        if (std::holds_alternative<Send>(op.work)) CHECK(op.stream == Stream::dp_comm);
      }
    }
  }
}

TEST_CASE("parameter server: the next iteration's forward waits for its layer's pull") {
  // Two layers, one worker, one server: iteration 2's forward of each layer depends on that
  // layer's pull in iteration 1 (and on nothing else of iteration 1 but stream order).
  const TempDir dir("ps-pull-deps");
  const Experiment e = ps_experiment(dir, 2, 1'000'000, 1, 1);
  const Program p = study::lower(e, {.iterations = 2});
  const auto ops = p.ops_of(0);
  const std::size_t per = ops.size() / 2;
  for (std::size_t k = per; k < ops.size(); ++k) {
    const Op& op = ops[k];
    if (op.phase != Phase::forward) continue;
    int pulls = 0;
    for (OpId d : p.deps_of(op)) {
      const Op& dep = p.op(d);
      if (!std::holds_alternative<Recv>(dep.work)) continue;
      ++pulls;
      CHECK(dep.layer_begin == op.layer_begin);
      CHECK(p.iteration_of(d) == 0);
    }
    CHECK(pulls == 1);
  }
}

TEST_CASE("parameter server slices: a layer cut into slices, spread over the servers") {
  // One layer of 25M fp32 parameters, one worker, two servers, slices of 12.5M parameters: two
  // slices of 50 MB each way, slice 1 on server 0 and slice 2 on server 1 (the least loaded). The
  // analytical network times each message alone: 10 us + 50e6 / 10e9 s = 5.01 ms, both pushes
  // at 6 ms (forward 1 ms, backward 5 ms) to different servers, each server's update U' of its
  // slice side by side, and both pulls 5.01 ms later: 6 + 5.01 + U' + 5.01 ms, against
  // 6 + 10.01 + U + 10.01 ms with the whole layer on one server.
  const TempDir dir("ps-slices");
  const Experiment e = ps_experiment(dir, 1, 25'000'000, 1, 2, 12'500'000);
  const study::Result r = study::simulate(e, {});
  REQUIRE(r.finished());
  const Program& p = r.program;
  REQUIRE(p.world_size() == 3);
  std::vector<std::int32_t> pushed_to;
  for (const Op& op : p.ops_of(0)) {
    if (const auto* s = std::get_if<Send>(&op.work)) {
      CHECK(s->bytes.count() == 50'000'000);
      pushed_to.push_back(s->peer);
    }
  }
  CHECK(pushed_to == std::vector<std::int32_t>{1, 2});
  CHECK(p.event_driven(1));
  CHECK(p.event_driven(2));
  CHECK_FALSE(p.event_driven(0));
  const double message = 10e-6 + 50e6 / 10e9;
  const double update = span_of(r, "ps update L0 slice 1/2").seconds();
  CHECK(span_of(r, "ps update L0 slice 2/2").seconds() == doctest::Approx(update));
  CHECK(r.report.iteration_time_s ==
        doctest::Approx(6e-3 + message + update + message).epsilon(1e-9));
}

TEST_CASE("parameter server slices: VGG-16 in slices of 1M parameters, balanced over 2 servers") {
  // Each layer of P parameters becomes ceil(P / 1e6) slices; every byte is still pushed and
  // pulled once (2 x 2 x 138,357,544 bytes per worker in fp16). Slices go largest first to the
  // least-loaded server, so the two servers' shares differ by at most one slice (1e6).
  const Experiment e = load_experiment(configs_dir() / "experiments/vgg16-ps-v100-10.json",
                                       {{"parallelism.slice_parameters", 1'000'000, "test"}});
  const Program p = study::lower(e, {});
  std::int64_t slices = 0;
  for (const auto& layer : e.layer_table->expanded()) {
    slices += (layer.params + 999'999) / 1'000'000;
  }
  std::int64_t pushes = 0, pushed = 0;
  std::array<std::int64_t, 2> held{};
  for (const Op& op : p.ops_of(0)) {
    if (const auto* s = std::get_if<Send>(&op.work)) {
      ++pushes;
      pushed += s->bytes.count();
      held[static_cast<std::size_t>(s->peer - 8)] += s->bytes.count() / 2;
    }
  }
  CHECK(pushes == slices);
  CHECK(pushed == 2 * 138'357'544);
  CHECK(std::abs(held[0] - held[1]) <= 1'000'000);
}

namespace {

// The whole run of `n` iterations of a shipped parameter-server experiment under a transport
// policy, with slices of `slice` parameters (0: whole layers).
double run_time(const std::string& name, const std::string& priority, bool fifo_within,
                std::int64_t slice, int n) {
  std::vector<Override> overrides = {{"transport.priority", priority, "test"},
                                     {"parallelism.slice_parameters", slice, "test"}};
  if (fifo_within) overrides.push_back({"transport.within_class", "fifo", "test"});
  const Experiment e =
      load_experiment(configs_dir() / ("experiments/" + name + ".json"), overrides);
  study::Options options;
  options.iterations = n;
  const study::Result r = study::simulate(e, options);
  REQUIRE(r.finished());
  return r.report.iteration_time_s * n;
}

}  // namespace

TEST_CASE("parameter servers on 25 GbE: layer priority beats message FIFO, within the link bound") {
  // Three iterations back to back, 8 workers and 2 servers on 25 Gb/s (3.125e9 B/s) NICs.
  // Layer priority with FIFO inside a class (P3's queues) against message FIFO: the layer order
  // lets the next forward start on the first layers' pulls while later layers still move.
  // No order can beat the servers' NICs: the busier server holds at least half the parameters P,
  // so its NIC takes at least 3 x 8 x (P / 2) x 2 bytes of pushes (fp16): a run lasts at least
  // 24 P / 3.125e9 s. P: 25,557,032 for ResNet-50 and 138,357,544 for VGG-16 (He et al. 2016;
  // Simonyan & Zisserman 2015; the layer tables in configs/models/layers).
  struct Case {
    std::string name;
    std::int64_t parameters;
    std::int64_t slice;
  };
  for (const Case& c : {Case{"resnet50-ps-v100-10", 25'557'032, 0},
                        Case{"vgg16-ps-v100-10", 138'357'544, 250'000}}) {
    CAPTURE(c.name);
    const double bound = 24.0 * static_cast<double>(c.parameters) / 3.125e9;
    const double fifo = run_time(c.name, "fifo", false, c.slice, 3);
    const double layer = run_time(c.name, "layer", true, c.slice, 3);
    CHECK(layer < fifo);
    CHECK(fifo - layer <= fifo - bound);  // the saving: at most what FIFO takes above the bound
  }
}

}  // namespace stratasim::testing
