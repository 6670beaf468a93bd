// Megatron's --overlap-param-gather (parallelism.overlap_param_gather): the distributed
// optimizer's parameter all-gathers move from after the optimizer step to the iteration's start,
// each bucket waited for by the first forward op using its parameters (Megatron-core's
// DistributedDataParallel dispatches a bucket's all-gather from the forward pre-hooks of the
// next iteration: param_and_grad_buffer.py, start_param_sync / finish_param_sync).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// A 4-layer GPT (hidden 1024, 16 heads) on 1 x 1 x dp test devices, Megatron's distributed
// optimizer on.
Experiment small(int dp) {
  auto e = make_experiment(gpt(16, 1024, 4), 1, 1, dp, 4 * dp, 1, 512);
  e.training.framework = Framework::megatron;
  e.training.distributed_optimizer = true;
  return e;
}

bool is_param_gather(const Program& p, const Op& op) {
  const auto* c = std::get_if<Collective>(&op.work);
  return c && c->kind == CollectiveKind::all_gather && p.groups()[c->group].name.starts_with("dp");
}

struct Gathers {
  std::vector<OpId> ids;  // rank 0's parameter all-gathers, in issue order
  std::int64_t bytes = 0;
  OpId first_forward = 0, step = 0;  // the first forward compute op; the optimizer step
  bool has_step = false;
};

Gathers gathers_of(const Program& p, int rank) {
  Gathers g;
  bool forward = false;
  const auto ops = p.ops_of(rank);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const OpId id = p.first_op(rank) + static_cast<OpId>(i);
    if (is_param_gather(p, op)) {
      g.ids.push_back(id);
      g.bytes += std::get<Collective>(op.work).bytes.count();
    }
    if (!forward && op.phase == Phase::forward && std::holds_alternative<Compute>(op.work)) {
      g.first_forward = id;
      forward = true;
    }
    if (op.phase == Phase::optimizer && op.stream == Stream::compute &&
        p.label_of(op).find("optimizer") != std::string::npos) {
      g.step = id;
      g.has_step = true;
    }
  }
  return g;
}

// The forward compute ops of microbatch 0 on `rank` that wait for `gather`.
std::vector<OpId> forward_waiters(const Program& p, int rank, OpId gather) {
  std::vector<OpId> out;
  const auto ops = p.ops_of(rank);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.phase != Phase::forward) continue;
    const auto deps = p.deps_of(op);
    if (std::find(deps.begin(), deps.end(), gather) == deps.end()) continue;
    CHECK(op.microbatch == 0);
    out.push_back(p.first_op(rank) + static_cast<OpId>(i));
  }
  return out;
}

}  // namespace

TEST_CASE(
    "overlap_param_gather: the gathers come first, each bucket waited for by its first "
    "forward op, none after the step") {
  const int dp = 4;
  auto e = small(dp);
  const std::int64_t psi = pipeline_spec(e).stages[0].parameters;
  const Gathers after = gathers_of(lower_checked(e), 0);
  // Without: every bf16 parameter gathered once (2 psi bytes), after the optimizer step.
  CHECK(after.bytes == 2 * psi);
  REQUIRE(after.has_step);
  REQUIRE_FALSE(after.ids.empty());
  for (OpId id : after.ids) CHECK(id > after.step);

  e.parallelism.overlap_param_gather = true;
  const Program p = lower_checked(e);
  const Gathers g = gathers_of(p, 0);
  // The same 2 psi bytes, all issued before the first forward op, with no dependency (the
  // previous iteration's step came before), none after the step.
  CHECK(g.bytes == 2 * psi);
  REQUIRE(g.has_step);
  REQUIRE_FALSE(g.ids.empty());
  OpId previous_waiter = 0;
  for (std::size_t k = 0; k < g.ids.size(); ++k) {
    CAPTURE(k);
    const OpId id = g.ids[k];
    CHECK(id < g.first_forward);
    CHECK(p.deps_of(p.op(id)).empty());
    // Exactly one forward op (the first using the bucket, in microbatch 0) waits for it; the
    // buckets go in layer order, so their waiters do too.
    const auto waiters = forward_waiters(p, 0, id);
    REQUIRE(waiters.size() == 1);
    CHECK(waiters[0] >= previous_waiter);
    previous_waiter = waiters[0];
  }
  // Bucket 0 holds the embedding (the first parameters the forward uses): the very first forward
  // op waits for it. The last bucket holds layer 3 (Megatron fills buckets in backward order,
  // so the last layer is in the first bucket filled, the last gathered): the first forward op
  // of layer 3 waits for it.
  CHECK(forward_waiters(p, 0, g.ids.front())[0] == g.first_forward);
  const Op& last_waiter = p.op(forward_waiters(p, 0, g.ids.back())[0]);
  CHECK(last_waiter.layer_begin <= 3);
  CHECK(3 < last_waiter.layer_end);
}

TEST_CASE(
    "overlap_param_gather with one bucket per unit: each layer's first forward op waits "
    "for a gather of that layer's 2-byte parameters") {
  // DeepSpeed ZeRO-1 with allgather_bucket_size 1 element: every gradient unit is a bucket, so
  // layer L's gather moves 2 x (layer L's parameters) bytes (bf16) and the first forward op
  // covering L waits for it.
  auto e = small(2);
  e.training.distributed_optimizer = false;
  e.parallelism.zero = 1;
  e.parallelism.allgather_bucket_size = 1;
  e.parallelism.overlap_param_gather = true;
  const auto plan = pipeline_spec(e).stages[0];
  const Program p = lower_checked(e);
  const Gathers g = gathers_of(p, 0);
  CHECK(g.ids.size() == plan.grad_units.size());
  int layers = 0;
  for (const GradUnit& unit : plan.grad_units) {
    if (unit.layer < 0) continue;
    ++layers;
    CAPTURE(unit.layer);
    // The first forward compute op covering the layer.
    OpId first = 0;
    bool found = false;
    const auto ops = p.ops_of(0);
    for (std::size_t i = 0; i < ops.size() && !found; ++i) {
      const Op& op = ops[i];
      if (op.phase == Phase::forward && std::holds_alternative<Compute>(op.work) &&
          op.layer_begin <= unit.layer && unit.layer < op.layer_end) {
        first = p.first_op(0) + static_cast<OpId>(i);
        found = true;
      }
    }
    REQUIRE(found);
    bool waits = false;
    for (OpId dep : p.deps_of(p.op(first))) {
      if (!is_param_gather(p, p.op(dep))) continue;
      waits = waits || std::get<Collective>(p.op(dep).work).bytes.count() == 2 * unit.parameters;
    }
    CHECK(waits);
  }
  CHECK(layers == 4);
}

TEST_CASE(
    "overlap_param_gather: a dp 4 iteration is not longer than with the gathers after the "
    "step") {
  // Without overlap the gathers (2 psi bytes over dp 4) run after the optimizer step, exposed at
  // the end of the iteration; with it they run beside the forward of the first microbatch.
  auto e = small(4);
  const double plain =
      report_of(e, lower_checked(e), simulate_checked(e, lower_checked(e), true)).iteration_time_s;
  e.parallelism.overlap_param_gather = true;
  const Program p = lower_checked(e);
  const double overlapped = report_of(e, p, simulate_checked(e, p, true)).iteration_time_s;
  MESSAGE("iteration " << plain << " s, with overlap_param_gather " << overlapped << " s");
  CHECK(overlapped <= plain);
  CHECK(overlapped < plain);  // the post-step gathers were exposed: some time comes back
}

TEST_CASE("overlap_param_gather without the distributed optimizer is an error naming the key") {
  const auto error = default_experiment_error({cli("parallelism.overlap_param_gather", true)});
  CHECK(error.path() == "parallelism.overlap_param_gather");
  CHECK(error.message().find("distributed optimizer") != std::string::npos);
}
