#include <array>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

PipelineScatterGather::PipelineScatterGather(Assembly& assembly)
    : assembly_(assembly), label_(assembly.program.intern_label("pipeline all-gather")) {}

void PipelineScatterGather::input_received(RankEmitter& rank, const PassState& ps, Bytes boundary,
                                           std::vector<OpId>& input) {
  // Every rank of the group received its 1/tp: the whole tensor is rebuilt before use.
  OpInfo info{Stream::tp_comm, ps.phase, ps.microbatch, -1, -1, {}};
  info.label_id = label_;
  const OpId gather =
      rank.program.add(Collective{CollectiveKind::all_gather, assembly_.spec.dtype,
                                  assembly_.groups.tp(TpAxis::tp, rank.rank), boundary},
                       info, input);
  input.assign(1, gather);
}

}  // namespace stratasim::strategies
