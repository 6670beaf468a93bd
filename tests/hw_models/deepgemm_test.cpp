// DeepGEMM's launch configuration and time (hw_models/kernel_model.hpp: deepgemm_launch,
// deepgemm_seconds), each checked against a hand calculation from DeepGEMM's heuristic
// (deepseek-ai/DeepGEMM 55ab91f, deep_gemm/jit_kernels/gemm.py: get_best_configs) and the
// documented formula (docs/gemm-efficiency.md).
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "hw_models/config_reader.hpp"
#include "hw_models/kernel_model.hpp"

using namespace stratasim;

TEST_CASE("deepgemm: m = 4096, n = 2112, k = 7168 on 132 SMs runs 480 tiles of 128 x 144") {
  // block_m = 128 (m > 64): 32 row blocks. Waves = ceil(32 x ceil(2112 / block_n) / 132):
  //   block_n 160: 14 column blocks, 448 tiles, 4 waves, last wave 448 - 3 x 132 = 52;
  //   block_n 144: 15 column blocks, 480 tiles, 4 waves, last wave 84;
  //   block_n 128: 17 column blocks, 544 tiles, 5 waves (and every smaller block_n more).
  // Fewest waves, then the fuller last wave: 144.
  // Stages: 128 / gcd(128, 144) = 8 > 4, so 8..4 are tried; shared memory
  //   128 x 144 x 2 + s x (128 x 128 + 128 x 4 + 144 x 128) + 56 x 4 x 2 + 16 s
  //   = 36864 + 35344 s + 448: s = 6 gives 249,376 > 232,448, s = 5 gives 214,032: 5 stages.
  // Multicast: m >= 512, one group; block_m 128 < block_n 144 so B first: m % 256 == 0, legal.
  // SMs: max(ceil(480 / 4), 132 - 8) = 124, a multiple of the cluster of 2.
  const hw::DeepGemmLaunch l = hw::deepgemm_launch(4096, 2112, 7168, 1, 132);
  CHECK(l.block_m == 128);
  CHECK(l.block_n == 144);
  CHECK(l.tiles == 480);
  CHECK(l.waves == 4);
  CHECK(l.stages == 5);
  CHECK(l.multicast == 2);
  CHECK_FALSE(l.multicast_on_a);
  CHECK(l.sms == 124);
  CHECK(l.predicated_promotion);  // 144 straddles 128-row scale blocks, 8 > 4: not unrolled
}

TEST_CASE("deepgemm: m = 64, n = 7168, k = 2048 runs one wave of 128 tiles of 64 x 56") {
  // block_m = 64 (m <= 64): one row block. ceil(7168 / 56) = 128 tiles fit one wave of 132;
  // block_n 48 needs 150 (two waves), 64 gives 112 (one wave, emptier). 8 stages fit:
  // 64 x 56 x 2 + 8 x (64 x 128 + 64 x 4 + 56 x 128) + 16 x 4 x 2 + 8 x 16 = 132,352 bytes.
  // No multicast (m < 512); SMs max(128, 124) = 128.
  const hw::DeepGemmLaunch l = hw::deepgemm_launch(64, 7168, 2048, 1, 132);
  CHECK(l.block_m == 64);
  CHECK(l.block_n == 56);
  CHECK(l.tiles == 128);
  CHECK(l.waves == 1);
  CHECK(l.stages == 8);
  CHECK(l.multicast == 1);
  CHECK(l.sms == 128);
}

TEST_CASE("deepgemm: a grouped GEMM's tiles are the groups' (masked layout, no multicast)") {
  // 4 groups of 256 x 4096 x 7168: 2 row blocks per group; block_n 128 gives 4 x 2 x 32 = 256
  // tiles, 2 waves with a last wave of 124 (block_n 120: 4 x 2 x 35 = 280, 3 waves).
  const hw::DeepGemmLaunch l = hw::deepgemm_launch(256, 4096, 7168, 4, 132);
  CHECK(l.block_m == 128);
  CHECK(l.block_n == 128);
  CHECK(l.tiles == 256);
  CHECK(l.waves == 2);
  CHECK(l.multicast == 1);  // DeepGEMM multicasts within one group only
  CHECK_FALSE(l.predicated_promotion);
}

TEST_CASE("deepgemm: time by hand") {
  // 128 SMs of 1 TFLOP/s each, 1 TB/s of HBM; m = 64, n = 7168, k = 2048 runs one wave of
  // 64 x 56 tiles in 8 stages (as above: 128 tiles fill the 128 SMs).
  hw::GemmModel g;
  g.peak_fraction = 0.5;
  g.latency = 2e-6;
  g.deepgemm = hw::DeepGemmModel{.memory_fraction = 0.5,
                                 .overlap = 1,
                                 .load_latency = 1e-6,
                                 .tile_latency = 1e-6,
                                 .predicated_promotion = 0.5};
  // 56 straddles the 128-row scale blocks (128 / gcd(128, 56) = 16 > 4): the predicated
  // promotion. An SM: 1e12 x 0.5 x 0.5 = 0.25 TFLOP/s; a tile 2 x 64 x 56 x 2048 = 14,680,064
  // FLOP: 58.720256 us (the pipeline's 16 / 8 x 1 us = 2 us is shorter); + 1 us per tile.
  // Bytes: 64 x 2048 + 7168 x 2048 + 2 x 64 x 7168 + 4 x 64 x 16 + 4 x 56 x 16 = 15,736,320
  // at 0.5 TB/s: 31.47264 us. Overlap 1 adds them: 59.720256 + 31.47264 + 2 = 93.192896 us.
  CHECK(hw::deepgemm_seconds(g, 64, 7168, 2048, 1, 128, 128e12, 1e12) ==
        doctest::Approx(93.192896e-6).epsilon(1e-9));
  // A large overlap exponent hides the shorter one: max(59.720256, 31.47264) + 2 us.
  g.deepgemm->overlap = 200;
  CHECK(hw::deepgemm_seconds(g, 64, 7168, 2048, 1, 128, 128e12, 1e12) ==
        doctest::Approx(61.720256e-6).epsilon(1e-4));
  // The pipeline bound: with a 100 us round trip, 2 rounds take 200 us per tile.
  g.deepgemm->overlap = 1;
  g.deepgemm->load_latency = 100e-6;
  CHECK(hw::deepgemm_seconds(g, 64, 7168, 2048, 1, 128, 128e12, 1e12) ==
        doctest::Approx((200 + 1 + 31.47264 + 2) * 1e-6).epsilon(1e-9));
}

TEST_CASE("deepgemm: the kernel model's \"deepgemm\" block reads, round-trips and is checked") {
  nlohmann::json j = nlohmann::json::parse(R"({
    "schema": "stratasim-kernel-model", "schema_version": 1, "device": "test-gpu",
    "gemm": {"fp8-block": {"peak_fraction": 0.75, "latency": "0.8 us",
                           "deepgemm": {"memory_fraction": 0.9, "overlap": 1.8,
                                        "load_latency": "0.85 us", "tile_latency": "1.3 us",
                                        "predicated_promotion": 0.87}}}
  })");
  auto read = [](const nlohmann::json& v) {
    return hw::read_kernel_model(config::Document::from_json(v, "model.json"), "");
  };
  const auto m = read(j);
  const auto* g = m.gemm_for(DType::fp8, hw::GemmScaling::block);
  REQUIRE(g != nullptr);
  REQUIRE(g->deepgemm);
  CHECK(g->deepgemm->memory_fraction == 0.9);
  CHECK(g->deepgemm->overlap == 1.8);
  CHECK(g->deepgemm->load_latency == doctest::Approx(0.85e-6));
  CHECK(g->deepgemm->tile_latency == doctest::Approx(1.3e-6));
  CHECK(g->deepgemm->predicated_promotion == 0.87);
  // Written back: the DeepGEMM block instead of k_overhead and wave_loss, and read the same.
  const auto out = hw::to_json(m);
  CHECK_FALSE(out["gemm"]["fp8-block"].contains("k_overhead"));
  const auto again = read(out);
  CHECK(again.gemm_fp8_block->deepgemm->overlap == 1.8);
  // An overlap exponent below 1 would make the sum of the two times exceed it: an error.
  j["gemm"]["fp8-block"]["deepgemm"]["overlap"] = 0.5;
  try {
    read(j);
    FAIL("expected a validation error");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("gemm.fp8-block.deepgemm.overlap") != std::string::npos);
  }
  // A misspelt key is an error naming it.
  j["gemm"]["fp8-block"]["deepgemm"]["overlap"] = 1.8;
  j["gemm"]["fp8-block"]["deepgemm"]["tile_latncy"] = "1 us";
  CHECK_THROWS(read(j));
}
