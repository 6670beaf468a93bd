// Megatron-LM's pipeline details (Narayanan et al., SC21, arXiv:2104.04473; Megatron-LM's
// p2p_communication.py and finalize_model_grads): pipeline sends scattered over the
// tensor-parallel group without sequence parallelism, and the all-reduce of tied embeddings'
// gradients between the first and the last stage.
#include <doctest/doctest.h>

#include <string>
#include <variant>

#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// A GPT of 6 layers, h 1024, 16 heads, micro batch 1 of 512 tokens, 4 microbatches, bf16.
Experiment small_gpt(int tp, int pp, bool sequence_parallel) {
  auto e = make_experiment(gpt(16, 1024, 6), tp, pp, 1, 4, 1, 512, sequence_parallel);
  return e;
}

int count_label(const Program& p, int rank, const std::string& label) {
  int n = 0;
  for (const auto& op : p.ops_of(rank)) n += p.label_of(op) == label ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE(
    "pipeline sends are scattered over the tensor-parallel group without sequence "
    "parallelism") {
  // Megatron-LM (p2p_communication._communicate with scatter_gather_tensors_in_pipeline and no
  // sequence parallelism): each of the tp ranks sends 1/tp of the [s, b, h] boundary tensor and
  // the receivers rebuild it with an all-gather over their tensor-parallel group
  // (gather_split_1d_tensor). The boundary is s b h x 2 bytes = 512 x 1 x 1024 x 2 = 1,048,576
  // bytes; with tp 4 a rank sends 262,144. Sequence parallelism shards the boundary itself
  // (s/tp b h x 2 = 262,144): same bytes, nothing to gather.
  const std::int64_t whole = 512LL * 1024 * 2;
  struct Case {
    bool sequence_parallel, scatter;
    std::int64_t p2p;
    int gathers_stage0, gathers_stage1;
  };
  // Stage 1 (of 3) receives 4 activations and 4 gradients, stage 0 the 4 gradients.
  for (const Case c : {Case{false, true, whole / 4, 4, 8}, Case{false, false, whole, 0, 0},
                       Case{true, true, whole / 4, 0, 0}}) {
    CAPTURE(c.sequence_parallel);
    CAPTURE(c.scatter);
    auto e = small_gpt(4, 3, c.sequence_parallel);
    e.parallelism.pipeline_scatter_gather = c.scatter;
    const Program p = lower_checked(e);
    int sends = 0;
    for (int r = 0; r < p.world_size(); ++r) {
      for (const auto& op : p.ops_of(r)) {
        if (const auto* s = std::get_if<Send>(&op.work)) {
          CHECK(s->bytes.count() == c.p2p);
          ++sends;
        }
        if (const auto* v = std::get_if<Recv>(&op.work)) CHECK(v->bytes.count() == c.p2p);
      }
    }
    // 4 tp ranks x (stage 0: 4 activations; stage 1: 4 activations, 4 gradients; stage 2: 4
    // gradients).
    CHECK(sends == 4 * 16);
    CHECK(count_label(p, 0, "pipeline all-gather") == c.gathers_stage0);
    CHECK(count_label(p, 4, "pipeline all-gather") == c.gathers_stage1);
    // Each all-gather rebuilds the whole boundary over ranks 4..7 after the receive, and the
    // pass's first op waits for it.
    for (const auto& op : p.ops_of(4)) {
      if (p.label_of(op) != "pipeline all-gather") continue;
      const auto& gather = std::get<Collective>(op.work);
      CHECK(gather.kind == CollectiveKind::all_gather);
      CHECK(gather.bytes.count() == whole);
      CHECK(p.groups()[gather.group].ranks == std::vector<std::int32_t>{4, 5, 6, 7});
      const auto deps = p.deps_of(op);
      REQUIRE(deps.size() == 1);
      CHECK(std::holds_alternative<Recv>(p.op(deps[0]).work));
    }
  }
}

TEST_CASE("pipeline scatter/gather: the Megatron flag turns it off; the program still runs") {
  auto e = small_gpt(4, 3, false);
  e.cluster = shipped_cluster("dgx-a100-1", 1, 12);
  const auto with = lower_checked(e);
  const auto with_time = simulate_checked(e, with);
  e.parallelism.pipeline_scatter_gather = false;
  const auto without = lower_checked(e);
  const auto without_time = simulate_checked(e, without);
  CHECK(with.op_count() > without.op_count());
  CHECK(with_time.completed);
  CHECK(without_time.completed);
}

TEST_CASE("tied embeddings: one gradient all-reduce between the first and the last stage") {
  // Megatron (_allreduce_word_embedding_grads): the first stage's word embeddings and the last
  // stage's output layer share a weight; after the backward their main_grad is all-reduced over
  // the embedding group (the two stages' ranks of the same tp and dp index). A rank holds
  // ceil(51200 / 2) = 25,600 rows of h = 1024: 26,214,400 elements, in fp32 with Megatron's
  // bf16 default (fp32 main grads): 104,857,600 bytes; in bf16 without it: 52,428,800.
  for (const auto framework : {Framework::megatron, Framework::generic}) {
    CAPTURE(name_of(framework));
    auto e = small_gpt(2, 3, false);
    e.training.framework = framework;
    const Program p = lower_checked(e);
    const std::int64_t bytes = 25'600LL * 1024 * (framework == Framework::megatron ? 4 : 2);
    // Ranks: stage 0 = {0, 1}, stage 1 = {2, 3}, stage 2 = {4, 5}.
    for (int r = 0; r < 6; ++r) {
      CAPTURE(r);
      int found = 0;
      for (const auto& op : p.ops_of(r)) {
        if (p.label_of(op) != "embedding grad all-reduce") continue;
        ++found;
        const auto& c = std::get<Collective>(op.work);
        CHECK(c.kind == CollectiveKind::all_reduce);
        CHECK(c.bytes.count() == bytes);
        const int t = r % 2;
        CHECK(p.groups()[c.group].ranks == std::vector<std::int32_t>{t, 4 + t});
        // After the rank's last backward op.
        bool after_backward = false;
        for (OpId dep : p.deps_of(op)) after_backward |= p.op(dep).phase == Phase::backward;
        CHECK(after_backward);
      }
      CHECK(found == (r == 2 || r == 3 ? 0 : 1));
    }
  }
}

TEST_CASE(
    "GPT-3 175B: no recomputation is at least as fast as selective recomputation with "
    "sequence parallelism") {
  // Korthikanti et al. (arXiv:2205.05198, table 4): per layer of their 22B model, forward plus
  // backward takes 19.6 ms without recomputation and 20.3 ms with selective recomputation and
  // sequence parallelism: recomputing the attention core costs more than sequence parallelism
  // saves. On a pipeline of 16 stages the baseline without sequence parallelism also depends
  // on Megatron's scatter/gather of pipeline sends: without it each of the 8 tp ranks sends the
  // whole [s, b, h] activation, 8x the bytes of its share.
  auto e = load_experiment(configs_dir() / "experiments/gpt3-175b-a100-1024.json");
  LowerOptions mirror;
  mirror.mirror_data_parallel = true;
  mirror.mirror_tensor_parallel = true;
  const auto time = [&](const Experiment& x) {
    const Program p = lower(x, mirror);
    return report_of(x, p, simulate_checked(x, p, true)).iteration_time_s;
  };
  REQUIRE(e.parallelism.recompute == RecomputeKind::none);
  REQUIRE_FALSE(e.parallelism.sequence_parallel);
  const double none = time(e);
  e.parallelism.pipeline_scatter_gather = false;
  const double none_whole_sends = time(e);
  e.parallelism.pipeline_scatter_gather = true;
  e.parallelism.recompute = RecomputeKind::selective;
  e.parallelism.sequence_parallel = true;
  const double selective_sp = time(e);
  MESSAGE("GPT-3 175B on 1,024 A100s: " << none << " s without recomputation, " << selective_sp
                                        << " s with selective recomputation and sequence "
                                           "parallelism");
  CHECK(none <= selective_sp);
  // Each of the 8 tp ranks sending the whole 50 MB activation instead of its 6.3 MB share
  // (pipeline_scatter_gather false) slows the baseline.
  MESSAGE(none_whole_sends << " s without recomputation, whole sends");
  CHECK(none_whole_sends > none);
}

TEST_CASE(
    "interleaved schedule, batched p2p: a steady-state forward sends with the backward "
    "after it") {
  // Megatron-LM's interleaved schedule without overlap_p2p_comm (--no-overlap-p2p-communication,
  // batch_p2p_comm): every step's sends and receives are one batch_isend_irecv that the next
  // step waits for; a steady-state step is forward k then backward k, and
  // send_forward_backward_recv_forward_backward sends the forward's output only after the
  // backward. p = 4, v = 2, m = 8: 16 chunk forwards per device; device s warms up with
  // (p - s - 1) 2 + (v - 1) p of them (10, 8, 6, 4), the rest are steady (6, 8, 10, 12).
  // Devices 0 to 2 send from every forward; device 3 only from chunk 3, which forward k runs
  // when (k mod 8) / 4 = 0: steady forwards 8 to 11, 4 of them.
  auto e = make_experiment(gpt(16, 1024, 16), 1, 4, 1, 8, 1, 512);
  e.cluster = shipped_cluster("dgx-a100-1", 1, 4);
  e.parallelism.schedule = ScheduleKind::interleaved;
  e.parallelism.virtual_stages = 2;
  const Program overlapped = lower_checked(e);
  e.parallelism.pipeline_batched_p2p = true;
  const Program batched = lower_checked(e);
  const auto deferred_sends = [](const Program& p, int rank) {
    int deferred = 0;
    for (const auto& op : p.ops_of(rank)) {
      if (!std::holds_alternative<Send>(op.work) || op.phase != Phase::forward) continue;
      for (OpId dep : p.deps_of(op)) deferred += p.op(dep).phase == Phase::backward ? 1 : 0;
    }
    return deferred;
  };
  const int expected[] = {6, 8, 10, 4};
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    CHECK(deferred_sends(batched, rank) == expected[rank]);
    CHECK(deferred_sends(overlapped, rank) == 0);
  }
  // Batching only adds waits: never faster (an analytical network has no contention).
  const double t_overlapped =
      report_of(e, overlapped, simulate_checked(e, overlapped, true)).iteration_time_s;
  const double t_batched =
      report_of(e, batched, simulate_checked(e, batched, true)).iteration_time_s;
  MESSAGE("interleaved p 4, v 2, m 8: " << t_overlapped << " s overlapped, " << t_batched
                                        << " s batched");
  CHECK(t_batched >= t_overlapped);
}

TEST_CASE("batched p2p needs the interleaved schedule with more than two stages") {
  const auto error = default_experiment_error({cli("parallelism.pipeline_batched_p2p", true)});
  CHECK(std::string(error.what()).find("pipeline_batched_p2p") != std::string::npos);
}
