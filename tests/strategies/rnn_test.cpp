// RNN models (strategies/rnn.hpp): the FLOPs of an iteration by BPTT and by ADMMiRNN against
// closed forms derived here by hand, parameter counts, memory effects, mirroring and the
// experiment's checks.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strategies/experiment.hpp"
#include "strategies/rnn.hpp"
#include "test_paths.hpp"

namespace st = stratasim::strategies;
using stratasim::Bytes;
using stratasim::testing::configs_dir;

namespace {

st::Experiment load(const std::string& name, const std::vector<st::Override>& overrides = {}) {
  return st::load_experiment(configs_dir() / "experiments" / (name + ".json"), overrides);
}

st::Override set(std::string path, nlohmann::json value) {
  return st::Override{path, std::move(value), "test (--set " + path + ")"};
}

// Sum of matmul FLOPs over every compute op of every rank.
double program_flops(const st::Program& p) {
  double total = 0;
  for (const st::Op& op : p.ops()) {
    if (const auto* c = std::get_if<st::Compute>(&op.work)) {
      for (const st::Kernel& k : p.kernels_of(*c)) total += st::matmul_flops(k).count();
    }
  }
  return total;
}

struct CollectiveStats {
  int count = 0;
  std::int64_t bytes = 0;
};
CollectiveStats collectives_of_rank(const st::Program& p, int rank) {
  CollectiveStats s;
  for (const st::Op& op : p.ops_of(rank)) {
    if (const auto* c = std::get_if<st::Collective>(&op.work)) {
      ++s.count;
      s.bytes += c->bytes.count();
    }
  }
  return s;
}

std::string error_of(const std::string& name, const std::vector<st::Override>& overrides) {
  try {
    load(name, overrides);
  } catch (const stratasim::config::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("an LSTM's BPTT FLOPs per iteration equal the closed form") {
  // Per sample, per layer l and direction, the forward runs T steps of the gate GEMMs: the
  // input projection x_t W_x (I_l inputs, 4H gate outputs) and the recurrent h_{t-1} W_h (H
  // inputs): 2 T 4H (I_l + H) FLOPs; the output layer 2 T O H dirs. The backward is the dgrad
  // and wgrad GEMM of each: twice the forward. So an iteration of N samples costs
  //   3 N [ sum_l dirs 2 T 4H (I_l + H) + 2 T O H dirs ].
  // lstm-2x1024: N 512, T 35, H 1024, I_0 = I_1 = 1024, O 10000, one direction:
  //   layers 2 x 2 x 35 x 4096 x 2048 = 1,174,405,120; output 2 x 35 x 10000 x 1024 =
  //   716,800,000; per sample 1,891,205,120; x 3 x 512 = 2,904,891,064,320.
  const st::Experiment e = load("lstm-2x1024-a100-8");
  REQUIRE(e.rnn);
  CHECK(e.parallelism.dp == 8);
  CHECK(e.microbatches() == 2);  // 512 / (8 x 32): two microbatches accumulate
  const st::Program p = st::lower_rnn(e);
  CHECK(program_flops(p) == doctest::Approx(2'904'891'064'320.0).epsilon(1e-12));
  // Mirrored, rank 0 stands for all eight.
  const st::Program mirrored = st::lower_rnn(e, true);
  CHECK(mirrored.multiplicity(0) == 8);
  CHECK(program_flops(mirrored) * 8 == doctest::Approx(2'904'891'064'320.0).epsilon(1e-12));

  SUBCASE("a bidirectional GRU: 3 gate blocks, the upper layer reads both directions") {
    st::Experiment g = e;
    g.rnn->cell = st::RnnCell::gru;
    g.rnn->bidirectional = true;
    // layer 0: 2 dirs x 2 x 35 x 3072 x (1024 + 1024) = 880,803,840
    // layer 1: 2 dirs x 2 x 35 x 3072 x (2048 + 1024) = 1,321,205,760
    // output: 2 x 35 x 10000 x 2048 = 1,433,600,000; per sample 3,635,609,600; x 3 x 512
    CHECK(program_flops(st::lower_rnn(g)) == doctest::Approx(5'584'296'345'600.0).epsilon(1e-12));
  }
}

TEST_CASE("BPTT: parameters, gradient all-reduces per layer, activations freed by the backward") {
  const st::Experiment e = load("lstm-2x1024-a100-8");
  // Per layer 4H(I + H) + 8H = 4 x 1024 x 2048 + 8 x 1024 = 8,396,800; two layers; output
  // 10000 x 1024 + 10000 = 10,250,000: 27,043,600 in all.
  CHECK(e.rnn->parameters() == 27'043'600);
  const st::Program p = st::lower_rnn(e);
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    // One all-reduce per layer and one for the output layer, of the bf16 gradient buffers
    // (the generic framework's default): 2 bytes each.
    const CollectiveStats c = collectives_of_rank(p, r);
    CHECK(c.count == 3);
    CHECK(c.bytes == 27'043'600 * 2);
    std::int64_t params = 0, activations = 0;
    for (const st::ResidentMemory& m : p.initial_memory(r)) {
      if (m.category == st::MemoryCategory::parameters) params += m.bytes.count();
    }
    CHECK(params == 27'043'600 * 2);
    for (const st::Op& op : p.ops_of(r)) {
      for (const st::MemoryEffect& fx : p.effects_of(op)) {
        if (fx.category == st::MemoryCategory::activations) activations += fx.delta.count();
      }
    }
    CHECK(activations == 0);
  }
  // The last op of each rank is the optimizer step.
  const auto ops = p.ops_of(0);
  CHECK(ops.back().phase == st::Phase::optimizer);

  // Overlapped (the default), each all-reduce waits for its own layer's wgrads, which end at
  // different times; without dp_overlap, all wait for the last backward op.
  auto waits = [](const st::Program& q) {
    std::vector<st::OpId> after;
    for (const st::Op& op : q.ops_of(0)) {
      if (std::holds_alternative<st::Collective>(op.work)) after.push_back(q.deps_of(op)[0]);
    }
    return after;
  };
  const std::vector<st::OpId> overlapped = waits(p);
  REQUIRE(overlapped.size() == 3);
  CHECK(overlapped[0] < overlapped[1]);
  CHECK(overlapped[1] < overlapped[2]);
  const st::Program serial =
      st::lower_rnn(load("lstm-2x1024-a100-8", {set("parallelism.dp_overlap", false)}));
  const std::vector<st::OpId> after_backward = waits(serial);
  REQUIRE(after_backward.size() == 3);
  CHECK(after_backward[0] == after_backward[2]);
  CHECK(serial.op(after_backward[0]).phase == st::Phase::backward);
  CHECK(after_backward[0] == overlapped[2]);  // the last layer's wgrads end the backward
}

TEST_CASE("ADMMiRNN's FLOPs per iteration equal the count from its update rules") {
  // A rank holds B = global_batch / dp samples of T steps; input I, hidden H, output O; in
  // matrix form a_t = x_t U^T + h_{t-1} W^T + b, h_t = tanh(a_t), o_t = h_t V^T + c. One
  // iteration updates, in the paper's order (the products x U^T, h W^T, h V^T are kept from
  // the step that last computed them with the current values):
  //   U: grad_U = sum_t r_t^T x_t                    2 B T H I
  //   W: x_t U^T with the new U                       2 B T H I
  //      grad_W = sum_t r_t^T h_{t-1}                 2 B T H^2
  //   b: h_{t-1} W^T with the new W                   2 B T H^2   (closed form: sums)
  //   a: elementwise                                  0
  //   h: r_{t+1} W                                    2 B T H^2
  //      e_t V  (e_t = o_t - h_t V^T - c)             2 B T H O
  //   V: h_t V^T with the new h                       2 B T H O
  //      grad_V = sum_t e_t^T h_t                     2 B T H O
  //   c: h_t V^T with the new V                       2 B T H O   (closed form: sums)
  //   o: elementwise                                  0
  //   lambda: h_{t-1} W^T with the new h              2 B T H^2
  // In all 4 B T (H I + 2 H^2 + 2 H O) per rank. rnn-vanilla-1024 on 8 ranks, global batch
  // 512: B 64, T 35, H = I = 1024, O 10000:
  //   4 x 64 x 35 x (1,048,576 + 2,097,152 + 20,480,000) = 8960 x 23,625,728
  //   = 211,686,522,880 per rank; 1,693,492,183,040 for the 8.
  const st::Experiment e = load("rnn-vanilla-1024-admm-a100-8");
  REQUIRE(e.training.algorithm == st::TrainingAlgorithm::admm);
  const st::Program p = st::lower_rnn(e);
  CHECK(program_flops(p) == doctest::Approx(1'693'492'183'040.0).epsilon(1e-12));
  // Each iteration all-reduces the summed subproblem terms of U (H I), W (H^2), b (H), V (O H)
  // and c (O) over the data-parallel ranks, fp32: (1,048,576 + 1,048,576 + 1024 + 10,240,000 +
  // 10,000) x 4 bytes.
  const CollectiveStats c = collectives_of_rank(p, 3);
  CHECK(c.count == 5);
  CHECK(c.bytes == std::int64_t{12'348'176} * 4);
  // No optimizer: ADMM's own updates.
  for (const st::Op& op : p.ops_of(0)) CHECK(op.phase != st::Phase::optimizer);

  SUBCASE("on one GPU: no communication, the same FLOPs for the whole batch") {
    const st::Experiment one = load("rnn-vanilla-1024-admm-a100-8",
                                    {set("cluster.devices_per_node", 1), set("parallelism.dp", 1)});
    const st::Program q = st::lower_rnn(one);
    CHECK(collectives_of_rank(q, 0).count == 0);
    CHECK(program_flops(q) == doctest::Approx(1'693'492'183'040.0).epsilon(1e-12));
  }
}

TEST_CASE("RNN experiments: what is refused, named at its key") {
  CHECK(error_of("lstm-2x1024-a100-8", {set("model.timesteps", 0)}).find("model.timesteps") !=
        std::string::npos);
  CHECK(error_of("lstm-2x1024-a100-8", {set("model.timesteps", 0)}).find("at least 1") !=
        std::string::npos);
  CHECK(error_of("lstm-2x1024-a100-8", {set("model.cells", "gru")}).find("model.cells") !=
        std::string::npos);
  const std::string admm_lstm =
      error_of("lstm-2x1024-a100-8",
               {set("training.algorithm", "admm"), set("training.optimizer", nullptr)});
  CHECK(admm_lstm.find("lstm-2x1024.json: at cell") != std::string::npos);
  CHECK(admm_lstm.find("vanilla") != std::string::npos);
  CHECK(error_of("rnn-vanilla-1024-admm-a100-8", {set("model.layers", 2)}).find("model.layers") !=
        std::string::npos);
  CHECK(error_of("rnn-vanilla-1024-admm-a100-8", {set("training.optimizer", "adam")})
            .find("training.optimizer") != std::string::npos);
  CHECK(error_of("lstm-2x1024-a100-8", {set("parallelism.tp", 2), set("parallelism.dp", 4)})
            .find("parallelism.tp") != std::string::npos);
  CHECK(error_of("lstm-2x1024-a100-8", {set("parallelism.zero", 1)}).find("parallelism.zero") !=
        std::string::npos);
  CHECK(error_of("lstm-2x1024-a100-8", {set("parallelism.recompute", "full")})
            .find("parallelism.recompute") != std::string::npos);
  // What sweeps and searches set is accepted at its "off" value.
  CHECK(error_of("lstm-2x1024-a100-8",
                 {set("parallelism.zero", 0), set("parallelism.recompute", "none"),
                  set("parallelism.schedule", "1f1b"), set("parallelism.sequence_parallel", false),
                  set("parallelism.virtual_stages", 1)})
            .empty());
  CHECK(error_of("lstm-2x1024-a100-8", {set("parallelism.schedule", "zb-h1")})
            .find("parallelism.schedule") != std::string::npos);
  CHECK(
      error_of("lstm-2x1024-a100-8", {set("training.grad_clip", 1.0)}).find("training.grad_clip") !=
      std::string::npos);
  CHECK(error_of("lstm-2x1024-a100-8", {set("training.seq_len", 20)}).find("training.seq_len") !=
        std::string::npos);
  // A transformer cannot be trained by ADMMiRNN.
  CHECK(error_of("gpt3-1.7b-a100-8", {set("training.algorithm", "admm")})
            .find("training.algorithm") != std::string::npos);
  // tokens per iteration count timesteps.
  const st::Experiment e = load("lstm-2x1024-a100-8");
  CHECK(e.training.seq_len == 35);
  CHECK(e.tokens_per_iteration() == 512 * 35);
}

TEST_CASE("the RNN lowering is deterministic") {
  const st::Experiment e = load("lstm-gnmt-8x1024-a100-8");
  const st::Program a = st::lower_rnn(e), b = st::lower_rnn(e);
  REQUIRE(a.op_count() == b.op_count());
  bool same = a.labels() == b.labels();
  for (std::size_t i = 0; i < a.op_count() && same; ++i) {
    same =
        a.ops()[i].label == b.ops()[i].label && a.ops()[i].work.index() == b.ops()[i].work.index();
  }
  CHECK(same);
  CHECK_NOTHROW(st::validate(a));
  CHECK_NOTHROW(st::validate(st::lower_rnn(e, true)));
}
