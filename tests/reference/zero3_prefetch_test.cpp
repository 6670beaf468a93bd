// ZeRO-3's prefetch window and live-parameter limit as DeepSpeed sets them
// (stage3_prefetch_bucket_size, stage3_max_live_parameters: ZeroSettings): which release each
// layer's all-gather waits for, from DeepSpeed's PartitionedParameterCoordinator rule (prefetch
// while the parameters being prefetched are under the bucket; gather nothing that would take the
// live parameters over the limit), hand-applied to six layers of 100 parameters.
#include <doctest/doctest.h>

#include <string>

#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

PipelineSpec six_layers(std::int64_t bucket, std::int64_t live) {
  PipelineSpec spec;
  spec.layout = RankLayout{1, 2, 1};
  spec.zero.stage = 3;
  spec.zero.prefetch_bucket_size = bucket;
  spec.zero.max_live_parameters = live;
  StagePlan plan;
  for (int l = 0; l < 6; ++l) {
    plan.grad_units.push_back(GradUnit{"layer " + std::to_string(l), 100, l});
    Segment f;
    f.kernels = {Kernel{Measured{Time::us(100)}, "L"}};
    f.label = "L" + std::to_string(l);
    f.layer_begin = l;
    f.layer_end = l + 1;
    plan.forward.push_back(f);
  }
  for (int l = 5; l >= 0; --l) {
    Segment b = plan.forward[static_cast<std::size_t>(l)];
    b.label += " bwd";
    b.grads_done = {l};
    plan.backward.push_back(b);
  }
  plan.parameters = 600;
  spec.stages = {plan};
  return spec;
}

// The forward layer whose compute the forward gather of layer `j` waits for (-1: none).
int waits_for(const Program& p, int j) {
  for (const Op& op : p.ops_of(0)) {
    if (p.label_of(op) != "param all-gather layer " + std::to_string(j)) continue;
    for (OpId d : p.deps_of(op)) {
      const std::string& label = p.label_of(p.op(d));
      if (label.starts_with("L") && label.find("bwd") == std::string::npos) {
        return std::stoi(label.substr(1));
      }
    }
    return -1;
  }
  FAIL("no gather of layer " << j);
  return -2;
}

}  // namespace

TEST_CASE("ZeRO-3 prefetch bucket: layers gathered while the prefetched ones are under it") {
  // Default (one layer ahead): layer j's gather waits for layer j-2's compute.
  const Program one = assemble_pipeline(six_layers(0, 0));
  CHECK(waits_for(one, 1) == -1);
  CHECK(waits_for(one, 4) == 2);
  // Bucket 250: while layer c computes, layers c+1.. are fetched until 200 + 100 >= 250, so
  // layer j is fetched from the moment layer j-3 computes: it waits for layer j-4.
  const Program bucket = assemble_pipeline(six_layers(250, 0));
  CHECK(waits_for(bucket, 3) == -1);
  CHECK(waits_for(bucket, 4) == 0);
  CHECK(waits_for(bucket, 5) == 1);
}

TEST_CASE("ZeRO-3 live parameters: no gather beyond the limit") {
  // A limit of 150: only the layer in use is live, so layer j waits for layer j-1 to finish.
  const Program live = assemble_pipeline(six_layers(250, 150));
  CHECK(waits_for(live, 1) == 0);
  CHECK(waits_for(live, 5) == 4);
  // A limit of 300: three layers live at most, the bucket's window (j-4) narrowed to j-3.
  CHECK(waits_for(assemble_pipeline(six_layers(250, 300)), 5) == 2);
}
