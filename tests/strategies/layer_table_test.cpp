#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "experiment_helpers.hpp"
#include "strategies/layer_table.hpp"
#include "strategies/model.hpp"
#include "strategies/transformer.hpp"
#include "temp_dir.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

constexpr std::int64_t MiB = 1 << 20;

// A hand-made table, figures for micro-batches of 2 samples:
// - conv, twice: 1000 parameters, FLOPs (4 / 4 / 2 GFLOP), 6 MiB stored of which 2 MiB for the
//   weight gradient, 1 MiB output, 10 MiB of forward traffic;
// - pool: no parameters, 0 FLOP (backward defaults: 0 and, without parameters, 0), 1 KiB of
//   traffic, stores 3 B, outputs 5 B;
// - fc: 500 parameters, measured times 1.5 ms forward, 2 ms input gradient, weight gradient
//   defaulting to the forward's 1.5 ms; stores 1 KiB, outputs 4 B.
// Expanded: conv.0, conv.1, pool, fc (4 layers, 2 * 1000 + 500 = 2500 parameters).
nlohmann::json toy_json() {
  return nlohmann::json::parse(R"({
    "type": "layers", "name": "toy", "source": "hand-made", "batch": 2,
    "layers": [
      {"name": "conv", "repeat": 2, "params": 1000, "forward_flops": "4 GFLOP",
       "backward_input_flops": "4 GFLOP", "backward_weight_flops": "2 GFLOP",
       "activation_bytes": "6 MiB", "weight_grad_bytes": "2 MiB", "output_bytes": "1 MiB",
       "forward_bytes": "10 MiB"},
      {"name": "pool", "forward_flops": 0, "activation_bytes": "3 B", "output_bytes": "5 B",
       "forward_bytes": "1 KiB"},
      {"name": "fc", "params": 500, "forward_time": "1.5 ms", "backward_input_time": "2 ms",
       "activation_bytes": "1 KiB", "output_bytes": "4 B"}
    ]})");
}

LayerTableModel toy() {
  auto doc = config::Document::from_json({{"model", toy_json()}}, "toy");
  return read_layer_table(doc, "model");
}

/// The ConfigError reading `model` (put at "model" of an in-memory document) raises.
config::ConfigError read_error(const nlohmann::json& model) {
  auto doc = config::Document::from_json({{"model", model}}, "test");
  try {
    read_layer_table(doc, "model");
  } catch (const config::ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError");
  return config::ConfigError("", "", "");
}

LayerTableModel load_table(const std::string& name) {
  auto doc = config::Document::load(configs_dir() / "models" / "layers" / (name + ".json"));
  return read_layer_table(doc, "");
}

const RooflineWork& roofline(const Kernel& k) {
  REQUIRE(std::holds_alternative<RooflineWork>(k.work));
  return std::get<RooflineWork>(k.work);
}

Time measured(const Kernel& k) {
  REQUIRE(std::holds_alternative<Measured>(k.work));
  return std::get<Measured>(k.work).duration;
}

}  // namespace

TEST_CASE("layer table: reading fills defaults and expands repeats") {
  const auto m = toy();
  CHECK(m.name == "toy");
  CHECK(m.source == "hand-made");
  CHECK(m.batch == 2);
  REQUIRE(m.layers.size() == 3);
  CHECK(m.layer_count() == 4);
  CHECK(m.parameters() == 2500);  // 2 * 1000 + 500

  const auto& conv = m.layers[0];
  CHECK(conv.repeat == 2);
  CHECK(conv.forward_flops == Flops(4e9));
  CHECK(conv.backward_input_flops == Flops(4e9));
  CHECK(conv.backward_weight_flops == Flops(2e9));
  CHECK(conv.activation_bytes == Bytes(6 * MiB));
  CHECK(conv.weight_grad_bytes == Bytes(2 * MiB));
  CHECK(conv.forward_bytes == Bytes(10 * MiB));
  CHECK_FALSE(conv.forward_time);

  // No parameters: the weight gradient defaults to nothing, the input gradient to the forward.
  const auto& pool = m.layers[1];
  CHECK(pool.params == 0);
  CHECK(pool.backward_input_flops == Flops(0));
  CHECK(pool.backward_weight_flops == Flops(0));

  const auto& fc = m.layers[2];
  CHECK(fc.forward_time == Time::us(1500));
  CHECK(fc.backward_input_time == Time::ms(2));
  CHECK(fc.backward_weight_time == Time::us(1500));  // the forward's, as it has weights
  CHECK(fc.weight_grad_bytes == Bytes(0));
  CHECK_FALSE(fc.forward_flops);

  const auto e = m.expanded();
  REQUIRE(e.size() == 4);
  CHECK(e[0].name == "conv.0");
  CHECK(e[1].name == "conv.1");
  CHECK(e[2].name == "pool");  // a single layer keeps its name
  CHECK(e[3].name == "fc");
  for (const auto& l : e) CHECK(l.repeat == 1);
}

TEST_CASE("layer table: the shipped tables load, validate and have the published sizes") {
  // torchvision counts: VGG-16 138,357,544 (Simonyan & Zisserman's 138M); ResNet-50
  // 25,557,032 (He et al.'s 25.6M).
  const auto vgg = load_table("vgg16-layers");
  CHECK(vgg.layer_count() == 16);  // 13 conv + 3 FC
  CHECK(static_cast<double>(vgg.parameters()) == doctest::Approx(138.36e6).epsilon(0.01));
  const auto resnet = load_table("resnet50-layers");
  CHECK(resnet.layer_count() == 18);  // stem, 16 bottleneck blocks, head
  CHECK(static_cast<double>(resnet.parameters()) == doctest::Approx(25.56e6).epsilon(0.01));
  const auto gnmt = load_table("gnmt-layers");
  CHECK(gnmt.layer_count() == 19);  // 2 embeddings, 8 + 8 LSTM layers, classifier
  const auto gpt = load_table("gpt3-1.7b-layers");
  CHECK(gpt.layer_count() == 26);  // embedding, 24 layers, head
  // The layer table has the transformer config's parameters (embedding with the learned
  // positions, 24 x (12h^2 + 13h), final norm; the head is tied).
  const auto transformer = load_model(configs_dir() / "models/gpt3-1.7b.json");
  CHECK(static_cast<double>(gpt.parameters()) ==
        doctest::Approx(static_cast<double>(transformer.parameters())).epsilon(0.01));
  CHECK(gpt.parameters() == transformer.parameters());
  for (const auto* m : {&vgg, &resnet, &gnmt, &gpt}) {
    CAPTURE(m->name);
    CHECK_FALSE(m->source.empty());
    CHECK_NOTHROW(m->validate());
  }
  // VGG-16 forward: 15.47 GMACs = 30.94 GFLOP per image; ResNet-50: 4.09 GMACs = 8.18 GFLOP.
  const auto forward_flops = [](const LayerTableModel& m) {
    double total = 0;
    for (const auto& l : m.expanded()) total += l.forward_flops.value_or(Flops()).count();
    return total;
  };
  CHECK(forward_flops(vgg) == doctest::Approx(30.94e9).epsilon(0.01));
  CHECK(forward_flops(resnet) == doctest::Approx(8.18e9).epsilon(0.01));
}

TEST_CASE("layer table: a transformer row has the FLOPs of the transformer lowering") {
  // Zero Bubble's table (reference case zb-analytic-tables): F = sbh(24h + 4s) and
  // B + W = sbh(48h + 8s), which is Megatron's count of the GEMMs and the full attention
  // matrices that plan_transformer_stage emits for one layer.
  const auto gpt = load_table("gpt3-1.7b-layers");
  const auto transformer = load_model(configs_dir() / "models/gpt3-1.7b.json");
  LayerSetting setting;
  setting.micro_batch = 1;
  setting.seq_len = 2048;
  const auto reference = plan_transformer_stage(transformer, setting, 1, 3, 5, 6);
  const auto sum = [](const std::vector<Segment>& pass) {
    double total = 0;
    for (const auto& s : pass) {
      for (const auto& k : s.kernels) total += matmul_flops(k).count();
    }
    return total;
  };
  const auto plan = plan_layer_table_stage(gpt, {}, 5, 6);
  CHECK(sum(plan.forward) == doctest::Approx(sum(reference.forward)).epsilon(1e-12));
  CHECK(sum(plan.backward) == doctest::Approx(sum(reference.backward)).epsilon(1e-12));
  // Activations: sbh(34 + 5as/h) = 2048 * (34 * 2304 + 5 * 24 * 2048) = 663,748,608 bytes.
  CHECK(plan.forward[0].activation_delta == Bytes(663'748'608));
  CHECK(weight_grad_bytes(gpt, {}, 5) == Bytes(32LL * 2048 * 2304));
  CHECK(plan.boundary_bytes == Bytes(2LL * 2048 * 2304));
}

TEST_CASE("layer table: errors name the JSON path") {
  SUBCASE("unknown key, with a suggestion") {
    auto j = toy_json();
    j["layers"].push_back({{"name", "extra"}, {"forwad_flops", "1 GFLOP"}});
    const auto e = read_error(j);
    CHECK(e.path() == "model.layers[3].forwad_flops");
    CHECK(e.message().find("did you mean 'forward_flops'") != std::string::npos);
  }
  SUBCASE("unknown key of the model") {
    auto j = toy_json();
    j["batches"] = 4;
    const auto e = read_error(j);
    CHECK(e.path() == "model.batches");
    CHECK(e.message().find("did you mean 'batch'") != std::string::npos);
  }
  SUBCASE("both FLOPs and times") {
    auto j = toy_json();
    j["layers"][1]["forward_time"] = "1 ms";
    const auto e = read_error(j);
    CHECK(e.path() == "model.layers[1].forward_time");
    CHECK(e.message().find("not both") != std::string::npos);
  }
  SUBCASE("neither FLOPs nor times") {
    auto j = toy_json();
    j["layers"][2].erase("forward_time");
    j["layers"][2].erase("backward_input_time");
    const auto e = read_error(j);
    CHECK(e.path() == "model.layers[2].forward_flops");
    CHECK(e.message().find("either FLOPs") != std::string::npos);
  }
  SUBCASE("a backward figure without its forward") {
    auto j = toy_json();
    j["layers"][2].erase("forward_time");  // backward_input_time alone
    const auto e = read_error(j);
    CHECK(e.path() == "model.layers[2].forward_time");
  }
  SUBCASE("negative FLOPs, as a string and as a number") {
    auto j = toy_json();
    j["layers"][0]["forward_flops"] = "-4 GFLOP";
    auto e = read_error(j);
    CHECK(e.path() == "model.layers[0].forward_flops");
    CHECK(e.message().find("expected an amount of work") != std::string::npos);
    j["layers"][0]["forward_flops"] = -4e9;
    e = read_error(j);
    CHECK(e.path() == "model.layers[0].forward_flops");
    CHECK(e.message().find("non-negative") != std::string::npos);
  }
  SUBCASE("negative sizes, times and counts") {
    auto j = toy_json();
    j["layers"][1]["activation_bytes"] = "-3 MiB";
    CHECK(read_error(j).path() == "model.layers[1].activation_bytes");
    j = toy_json();
    j["layers"][2]["forward_time"] = "-1 ms";
    CHECK(read_error(j).path() == "model.layers[2].forward_time");
    j = toy_json();
    j["layers"][0]["params"] = -1;
    CHECK(read_error(j).path() == "model.layers[0].params");
    j = toy_json();
    j["layers"][0]["repeat"] = 0;
    CHECK(read_error(j).path() == "model.layers[0].repeat");
  }
  SUBCASE("weight-gradient bytes beyond the stored activations") {
    auto j = toy_json();
    j["layers"][0]["weight_grad_bytes"] = "7 MiB";  // of 6 MiB
    CHECK(read_error(j).path() == "model.layers[0].weight_grad_bytes");
  }
  SUBCASE("wrong type and empty list") {
    auto j = toy_json();
    j["type"] = "transformer";
    CHECK(read_error(j).path() == "model.type");
    j = toy_json();
    j["layers"] = nlohmann::json::array();
    CHECK(read_error(j).path() == "model.layers");
    j = toy_json();
    j["layers"][1] = "pool";
    CHECK(read_error(j).path() == "model.layers[1]");
  }
}

TEST_CASE("layer table: an error in a referenced file names that file") {
  const testing::TempDir tmp("strategies");
  const auto& dir = tmp.path();
  auto j = toy_json();
  j["layers"][2]["backward_weigth_time"] = "1 ms";
  std::ofstream(dir / "bad-layers.json") << j.dump(2);
  std::ofstream(dir / "experiment.json") << R"({"model": "bad-layers.json"})";
  auto doc = config::Document::load(dir / "experiment.json");
  doc.inline_reference("model");
  try {
    read_layer_table(doc, "model");
    FAIL("expected a ConfigError");
  } catch (const config::ConfigError& e) {
    CHECK(e.source().find("bad-layers.json") != std::string::npos);
    CHECK(e.path() == "layers[2].backward_weigth_time");
    CHECK(e.message().find("did you mean 'backward_weight_time'") != std::string::npos);
  }
}

TEST_CASE("layer table: validate() names the key of a model built in code") {
  auto m = toy();
  m.layers[1].activation_bytes = Bytes(-1);
  try {
    m.validate();
    FAIL("expected a ValidationError");
  } catch (const config::ValidationError& e) {
    CHECK(e.path() == "layers[1].activation_bytes");
  }
  m = toy();
  m.layers[0].backward_weight_flops.reset();
  CHECK_THROWS_WITH_AS(m.validate(), doctest::Contains("missing"), config::ValidationError);
  m = toy();
  m.batch = 0;
  CHECK_THROWS_AS(m.validate(), config::ValidationError);
}

TEST_CASE("layer table: the plan of a stage") {
  const auto m = toy();
  const auto plan = plan_layer_table_stage(m, {.micro_batch = 2, .dtype = DType::bf16}, 0, 4);
  // One forward and one backward segment per expanded layer; no weight pass yet.
  REQUIRE(plan.forward.size() == 4);
  REQUIRE(plan.backward.size() == 4);
  CHECK(plan.weight.empty());

  CHECK(plan.forward[0].label == "conv.0");
  CHECK(plan.forward[0].layer_begin == 0);
  CHECK(plan.forward[0].layer_end == 1);
  REQUIRE(plan.forward[0].kernels.size() == 1);
  CHECK(plan.forward[0].kernels[0].name == "conv.0.fwd");
  CHECK(roofline(plan.forward[0].kernels[0]).flops == Flops(4e9));
  CHECK(roofline(plan.forward[0].kernels[0]).bytes == Bytes(10 * MiB));
  CHECK(plan.forward[0].activation_delta == Bytes(6 * MiB));
  CHECK(plan.forward[2].label == "pool");
  CHECK(plan.forward[2].activation_delta == Bytes(3));
  CHECK(plan.forward[3].kernels[0].name == "fc.fwd");
  CHECK(measured(plan.forward[3].kernels[0]) == Time::us(1500));

  // Backward runs last layer first: fc, pool, conv.1, conv.0.
  CHECK(plan.backward[0].label == "fc");
  CHECK(plan.backward[0].layer_begin == 3);
  REQUIRE(plan.backward[0].kernels.size() == 2);
  CHECK(plan.backward[0].kernels[0].name == "fc.dgrad");
  CHECK(measured(plan.backward[0].kernels[0]) == Time::ms(2));
  CHECK(plan.backward[0].kernels[1].name == "fc.wgrad");
  CHECK(measured(plan.backward[0].kernels[1]) == Time::us(1500));
  // The pool has no weights: its weight-gradient kernel (0 FLOP, 0 B) is left out.
  REQUIRE(plan.backward[1].kernels.size() == 1);
  CHECK(plan.backward[1].kernels[0].name == "pool.dgrad");
  CHECK(roofline(plan.backward[1].kernels[0]).bytes == Bytes(1024));
  REQUIRE(plan.backward[2].kernels.size() == 2);
  CHECK(plan.backward[2].kernels[0].name == "conv.1.dgrad");
  CHECK(roofline(plan.backward[2].kernels[0]).flops == Flops(4e9));
  CHECK(plan.backward[2].kernels[1].name == "conv.1.wgrad");
  CHECK(roofline(plan.backward[2].kernels[1]).flops == Flops(2e9));
  CHECK(roofline(plan.backward[2].kernels[1]).bytes == Bytes(10 * MiB));
  CHECK(plan.backward[3].label == "conv.0");

  // What forward stores, backward releases: 6 + 6 MiB + 3 B + 1 KiB in, the same out.
  Bytes net;
  for (const auto& s : plan.forward) net += s.activation_delta;
  CHECK(net == Bytes(12 * MiB + 3 + 1024));
  for (const auto& s : plan.backward) net += s.activation_delta;
  CHECK(net == Bytes(0));

  // Gradient units in backward order, each completed by its layer's backward segment.
  REQUIRE(plan.grad_units.size() == 4);
  CHECK(plan.grad_units[0].name == "L3");
  CHECK(plan.grad_units[0].parameters == 500);
  CHECK(plan.grad_units[1].name == "L2");
  CHECK(plan.grad_units[1].parameters == 0);
  CHECK(plan.grad_units[2].name == "L1");
  CHECK(plan.grad_units[3].name == "L0");
  CHECK(plan.grad_units[3].parameters == 1000);
  for (int i = 0; i < 4; ++i) {
    CHECK(plan.backward[static_cast<std::size_t>(i)].grads_done == std::vector<int>{i});
  }
  CHECK(plan.parameters == 2500);
  CHECK(plan.boundary_bytes == Bytes(4));  // fc's output
}

TEST_CASE("layer table: a stage in the middle, and scaling with the micro-batch") {
  const auto m = toy();
  // Layers [1, 3): conv.1 and pool; figures for 2 samples, planned for 3 (x 1.5).
  const auto plan = plan_layer_table_stage(m, {.micro_batch = 3, .dtype = DType::fp16}, 1, 3);
  REQUIRE(plan.forward.size() == 2);
  CHECK(plan.forward[0].label == "conv.1");
  CHECK(plan.forward[0].layer_begin == 1);
  CHECK(roofline(plan.forward[0].kernels[0]).flops == Flops(6e9));       // 4 G x 1.5
  CHECK(roofline(plan.forward[0].kernels[0]).bytes == Bytes(15 * MiB));  // 10 MiB x 1.5
  CHECK(roofline(plan.forward[0].kernels[0]).dtype == DType::fp16);
  CHECK(plan.forward[0].activation_delta == Bytes(9 * MiB));  // 6 MiB x 1.5
  CHECK(plan.forward[1].activation_delta == Bytes(5));        // 3 B x 1.5 = 4.5, rounded up
  CHECK(plan.backward[0].activation_delta == Bytes(-5));
  CHECK(plan.backward[1].activation_delta == Bytes(-9 * MiB));
  REQUIRE(plan.grad_units.size() == 2);
  CHECK(plan.grad_units[0].name == "L2");
  CHECK(plan.grad_units[1].name == "L1");
  CHECK(plan.parameters == 1000);          // parameters do not scale
  CHECK(plan.boundary_bytes == Bytes(8));  // pool's 5 B x 1.5 = 7.5, rounded up

  // Times scale too: fc's 1.5 ms forward for 2 samples is 3 ms for 4.
  const auto last = plan_layer_table_stage(m, {.micro_batch = 4}, 3, 4);
  CHECK(measured(last.forward[0].kernels[0]) == Time::ms(3));
  CHECK(last.forward[0].activation_delta == Bytes(2048));

  // conv's output, 1 MiB for 2 samples, is 512 KiB for 1.
  CHECK(plan_layer_table_stage(m, {.micro_batch = 1}, 0, 2).boundary_bytes == Bytes(512 * 1024));

  CHECK(weight_grad_bytes(m, {.micro_batch = 4}, 1) == Bytes(4 * MiB));  // 2 MiB x 2
  CHECK(weight_grad_bytes(m, {.micro_batch = 4}, 2) == Bytes(0));
  CHECK_THROWS_AS(weight_grad_bytes(m, {}, 4), std::invalid_argument);
  CHECK_THROWS_AS(plan_layer_table_stage(m, {}, 0, 5), std::invalid_argument);
  CHECK_THROWS_AS(plan_layer_table_stage(m, {}, 2, 2), std::invalid_argument);
  CHECK_THROWS_AS(plan_layer_table_stage(m, {.micro_batch = 0}, 0, 1), std::invalid_argument);
}

TEST_CASE("layer table: the whole GPT table plans its parameters and the first layer's cost") {
  const auto gpt = load_table("gpt3-1.7b-layers");
  const auto plan = plan_layer_table_stage(gpt, {}, 0, gpt.layer_count());
  CHECK(plan.parameters == gpt.parameters());
  CHECK(plan.forward.size() == 26);
  CHECK(plan.forward[1].label == "transformer.0");
  CHECK(plan.forward[24].label == "transformer.23");
  // The embedding computes no input gradient: its backward is the weight scatter-add only.
  const auto& embedding_backward = plan.backward.back();
  CHECK(embedding_backward.label == "embedding");
  REQUIRE(embedding_backward.kernels.size() == 2);  // dgrad still moves its forward's bytes
  CHECK(roofline(embedding_backward.kernels[0]).flops == Flops(0));
}
