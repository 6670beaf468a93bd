// Data-parallel re-targeting (strategies/retarget.hpp): group sizes and members, send and
// receive peers, mirroring, placement against stratasim's rank layout, and the errors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "strategies/lowering.hpp"
#include "strategies/program.hpp"
#include "strategies/retarget.hpp"

namespace {

using namespace stratasim;
using namespace stratasim::strategies;

OpInfo on(Stream s, std::string_view label = {}) {
  OpInfo i;
  i.stream = s;
  i.phase = Phase::forward;
  i.label = label;
  return i;
}

// tp 1, dp 2, pp 2 in stratasim's layout (rank = dp_index + 2 * stage): ranks 0, 1 are stage
// 0, ranks 2, 3 stage 1. Stage 0 computes, sends 100 B to its stage-1 partner (rank + 2) and
// all-reduces 64 B on its dp group; stage 1 receives, computes after the receive, all-reduces.
// The "embedding" groups join the first and last stage of one replica ({0, 2}, {1, 3}).
Program pipeline(std::string dp_name = "dp s",
                 CollectiveKind dp_kind = CollectiveKind::all_reduce) {
  Program p(4);
  const auto dp0 = p.add_group({0, 1}, dp_name + "0");
  const auto dp1 = p.add_group({2, 3}, dp_name + "1");
  const auto emb0 = p.add_group({0, 2}, "embedding d0");
  const auto emb1 = p.add_group({1, 3}, "embedding d1");
  const auto k = p.add_kernels({Kernel{Measured{Time::us(10)}, "fwd"}});
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    if (r < 2) {
      const OpId c = p.add(Compute{k}, on(Stream::compute, "fwd"));
      const OpId deps[] = {c};
      p.add(Send{r + 2, Bytes(100)}, on(Stream::pp_send), deps);
      p.add(Collective{dp_kind, DType::bf16, dp0, Bytes(64)}, on(Stream::dp_comm), deps);
      p.add(Collective{CollectiveKind::all_reduce, DType::bf16, r == 0 ? emb0 : emb1, Bytes(8)},
            on(Stream::tp_comm));
    } else {
      const OpId v = p.add(Recv{r - 2, Bytes(100)}, on(Stream::pp_recv));
      const OpId deps[] = {v};
      const OpId c = p.add(Compute{k}, on(Stream::compute, "fwd"), deps);
      const OpId after[] = {c};
      p.add(Collective{dp_kind, DType::bf16, dp1, Bytes(64)}, on(Stream::dp_comm), after);
      p.add(Collective{CollectiveKind::all_reduce, DType::bf16, r == 2 ? emb0 : emb1, Bytes(8)},
            on(Stream::tp_comm));
    }
  }
  p.finish();
  validate(p);
  return p;
}

const Group* group_named(const Program& p, const std::string& name) {
  for (const auto& g : p.groups()) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

std::string error_of(const Program& p, int world, RetargetOptions o = {}) {
  try {
    retarget_data_parallel(p, world, o);
  } catch (const RetargetError& e) {
    return e.what();
  }
  FAIL("no RetargetError");
  return {};
}

}  // namespace

TEST_CASE("retarget: 2x the data-parallel width, every replica issuing ops") {
  const Program old = pipeline();
  // Data-parallel groups {0,1} and {2,3} fit aligned blocks of 2: B = 2, and replica j of old
  // rank r goes to (r / 2) * 4 + 2 j + r % 2: 0 -> 0, 2; 1 -> 1, 3; 2 -> 4, 6; 3 -> 5, 7.
  CHECK(data_parallel_block(old) == 2);
  CHECK(retargeted_rank(2, 1, 2, 2) == 6);
  CHECK(retarget_source_rank(6, 2, 2) == 2);
  const Program p = retarget_data_parallel(old, 8);
  validate(p);
  REQUIRE(p.world_size() == 8);
  CHECK_FALSE(p.mirrored());
  CHECK(p.op_count() == 2 * old.op_count());
  // The dp groups are twice as large; where a direct lowering with dp 4 puts them
  // (RankLayout{tp 1, dp 4, pp 2}: stage 0 is ranks 0-3, stage 1 ranks 4-7).
  const RankLayout layout{1, 4, 2};
  const Group* dp0 = group_named(p, "dp s0");
  const Group* dp1 = group_named(p, "dp s1");
  REQUIRE(dp0 != nullptr);
  REQUIRE(dp1 != nullptr);
  CHECK(dp0->ranks == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(dp1->ranks == std::vector<std::int32_t>{4, 5, 6, 7});
  for (int d = 0; d < 4; ++d)
    CHECK(layout.rank(0, d, 1) == dp1->ranks[static_cast<std::size_t>(d)]);
  // Other groups are copied per replica.
  REQUIRE(group_named(p, "embedding d0") != nullptr);
  CHECK(group_named(p, "embedding d0")->ranks == std::vector<std::int32_t>{0, 4});
  REQUIRE(group_named(p, "embedding d0 r1") != nullptr);
  CHECK(group_named(p, "embedding d0 r1")->ranks == std::vector<std::int32_t>{2, 6});
  CHECK(p.groups().size() == 2 + 2 * 2);
  // Sends stay within their replica: new rank 2 (old rank 0, replica 1) sends to 6.
  const auto ops2 = p.ops_of(2);
  REQUIRE(ops2.size() == 4);
  const auto* send = std::get_if<Send>(&ops2[1].work);
  REQUIRE(send != nullptr);
  CHECK(send->peer == 6);
  CHECK(send->bytes == Bytes(100));
  const auto* recv = std::get_if<Recv>(&p.ops_of(6)[0].work);
  REQUIRE(recv != nullptr);
  CHECK(recv->peer == 2);
  // Collective sizes stay; dependencies point into the new rank's own ops.
  const auto* ar = std::get_if<Collective>(&ops2[2].work);
  REQUIRE(ar != nullptr);
  CHECK(ar->bytes == Bytes(64));
  CHECK(p.groups()[ar->group].name == "dp s0");
  REQUIRE(p.deps_of(ops2[1]).size() == 1);
  CHECK(p.deps_of(ops2[1])[0] == p.first_op(2));
  CHECK(p.label_of(ops2[0]) == "fwd");
}

TEST_CASE("retarget: mirrored replicas") {
  const Program p = retarget_data_parallel(pipeline(), 16, {.mirror = true});
  validate(p);
  REQUIRE(p.world_size() == 16);
  CHECK(p.mirrored());
  // k = 4, B = 2: replicas j >= 1 of old rank r (new ranks 2..7 of stage 0) mirror replica 0.
  for (int r = 0; r < 16; ++r) {
    const int within = r % 8;
    const int rep = (r / 8) * 8 + within % 2;
    CAPTURE(r);
    CHECK(p.replica_of(r) == rep);
    CHECK(p.ops_of(r).size() == (rep == r ? 4u : 0u));
  }
  CHECK(p.multiplicity(0) == 4);
  CHECK(group_named(p, "dp s1")->ranks.size() == 8);
}

TEST_CASE("retarget: a mirrored program keeps its mirrors in every replica") {
  Program old(2);
  const auto dp = old.add_group({0, 1}, "DATA_PARALLEL");
  const auto k = old.add_kernels({Kernel{Measured{Time::us(1)}, "c"}});
  old.begin_rank(0);
  old.add(Compute{k}, on(Stream::compute));
  old.add(Collective{CollectiveKind::all_reduce, DType::bf16, dp, Bytes(64)}, on(Stream::dp_comm));
  old.finish();
  old.set_replica(1, 0);
  validate(old);
  const Program p = retarget_data_parallel(old, 4);  // Megatron's name matches the default
  validate(p);
  CHECK(p.replica_of(1) == 0);
  CHECK(p.replica_of(2) == 2);
  CHECK(p.replica_of(3) == 2);
  CHECK(p.groups()[0].ranks == std::vector<std::int32_t>{0, 1, 2, 3});
}

TEST_CASE("retarget: the same world size is a copy") {
  const Program old = pipeline();
  const Program p = retarget_data_parallel(old, 4);
  CHECK(p.op_count() == old.op_count());
  CHECK(p.groups().size() == old.groups().size());
}

TEST_CASE("retarget: ZeRO's reduce-scatters on dp groups give a note") {
  std::vector<std::string> notes;
  retarget_data_parallel(pipeline("dp s", CollectiveKind::reduce_scatter), 8, {.notes = &notes});
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("shard") != std::string::npos);
  notes.clear();
  retarget_data_parallel(pipeline(), 8, {.notes = &notes});
  CHECK(notes.empty());
}

TEST_CASE("retarget: errors say what to change") {
  const Program old = pipeline();
  CHECK(error_of(old, 6).find("multiple of 4") != std::string::npos);
  CHECK(error_of(old, 2).find("only growing") != std::string::npos);
  const auto none = error_of(pipeline("replicas "), 8);
  CHECK(none.find("no data-parallel group") != std::string::npos);
  CHECK(none.find("\"replicas 0\"") != std::string::npos);  // the groups the trace has
  CHECK(none.find("--dp-groups") != std::string::npos);
  CHECK(error_of(old, 8, {.dp_groups = "(("}).find("not a regular expression") !=
        std::string::npos);
  // Naming them works.
  const Program p = retarget_data_parallel(pipeline("replicas "), 8, {.dp_groups = "^replicas"});
  CHECK(p.groups()[0].ranks.size() == 4);
}
