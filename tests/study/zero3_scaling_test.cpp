// ZeRO-3 without model parallelism slows down per GPU as data parallelism widens at a fixed
// global batch, and a 3D layout beats it at 1,536 GPUs (the trend published for GPT-3 175B on
// A100s, e.g. ZeRO++ (Wang et al. 2023) and the Megatron-LM / ZeRO comparisons of Narayanan et
// al. SC21).
//
// From first principles: at a fixed global batch of 1,536 sequences, each of n GPUs runs
// 1,536 / n of them (here one micro-batch of 4, 2 or 1). Its compute per layer falls as 1/n,
// while every layer's all-gather (forward and backward) and reduce-scatter still move the whole
// layer's parameters: the communication per unit of compute grows 4x from 384 to 1,536 GPUs. So
// a larger share of each layer's compute runs beside NCCL's gathers (which hold SMs and device
// memory: interference, docs/network.md), small micro-batches run less efficient GEMMs, and more
// communication is exposed. Nothing here is fitted to these runs: the interference figures are
// NCCL's channel count and its maintainers' memory-traffic factor, the collectives the NCCL model
// fitted to nccl-tests sweeps.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "study/study.hpp"

using namespace stratasim;
using stratasim::testing::cli;

namespace {

double tflops_per_gpu(const std::vector<strategies::Override>& overrides) {
  auto e = strategies::load_experiment(
      testing::configs_dir() / "experiments/gpt3-175b-a100-1024.json", overrides);
  const auto r = study::simulate(std::move(e));
  REQUIRE(r.report.completed);
  REQUIRE(r.report.fits);
  return r.report.model_tflops_per_device;
}

double zero3(int gpus) {
  return tflops_per_gpu({cli("parallelism.tp", 1), cli("parallelism.pp", 1),
                         cli("parallelism.dp", gpus), cli("parallelism.zero", 3),
                         cli("parallelism.micro_batch", 1536 / gpus),
                         cli("parallelism.recompute", "full"), cli("cluster.nodes", gpus / 8)});
}

}  // namespace

TEST_CASE("ZeRO-3 of GPT-3 175B slows per GPU from 384 to 1,536 A100s; tp 8 x pp 16 beats it") {
  const double at384 = zero3(384);
  const double at768 = zero3(768);
  const double at1536 = zero3(1536);
  CAPTURE(at384);
  CAPTURE(at768);
  CAPTURE(at1536);
  CHECK(at768 < at384);
  CHECK(at1536 < at768);
  // The 3D layout of the same model and global batch on the same 1,536 GPUs.
  const double layout3d = tflops_per_gpu({cli("parallelism.tp", 8), cli("parallelism.pp", 16),
                                          cli("parallelism.dp", 12), cli("cluster.nodes", 192)});
  CAPTURE(layout3d);
  CHECK(layout3d > at1536);
}
