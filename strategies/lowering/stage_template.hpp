// Stage templates: each model part's plan (StagePlan, strategies/transformer.hpp) with its kernel
// lists and labels registered in the Program once, so that stamping it out for every rank and
// microbatch only adds ops. Also what every technique derives from a plan: which segments of a
// pass use which gradient unit's parameters (ZeRO-3), and the one way gradient units are grouped
// into buckets (data-parallel all-reduce, compressed synchronisation, ZeRO reduce-scatter).
//
// The Assembly is what the lowering of one PipelineSpec shares across ranks: the schedule, the
// Program being built, its communicator groups and the templates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strategies/lowering/communicators.hpp"
#include "strategies/lowering/pipeline_spec.hpp"

namespace stratasim::strategies {

/// A gradient unit's parameters as used by one pass (ZeRO-3 gathers them before `first` and
/// releases them after `last`); steps are indices into the pass's segments.
struct Use {
  int unit;   // index into StagePlan::grad_units
  int first;  // first step of the pass that touches the unit
  int last;   // last compute step touching it (last step at all when none computes)
};

/// Which steps of a pass (`forward`: a forward or recompute pass; otherwise a backward) touch
/// which gradient unit's parameters: a unit with a layer (GradUnit::layer >= 0) the steps
/// covering that layer; "embedding" the steps up to the first layer step in forward (from the
/// last one in backward) and "head" the mirror image (merged compute ops may hold the boundary
/// layer's kernels too, so the boundary step counts for both); any other unit, every step.
/// Sorted by first use, ties in the order the pass runs them; units no step touches are left out.
std::vector<Use> parameter_uses(const std::vector<Segment>& steps,
                                const std::vector<GradUnit>& units, bool forward);

/// Consecutive gradient units [first_unit, last_unit] reduced together.
struct UnitBucket {
  int first_unit = 0, last_unit = 0;
  std::int64_t parameters = 0;  // per rank, of all its units
  /// The model layers its units belong to (GradUnit::layer): [lowest, highest + 1), or -1, -1
  /// when none of its units is a layer's. Bucket ops carry it (transport priorities by layer,
  /// strategies/transport.hpp).
  int layer_begin = -1, layer_end = -1;
};
struct UnitBuckets {
  std::vector<UnitBucket> buckets;  // in the order backward completes them
  std::vector<int> of_unit;         // per unit, the index of its bucket
};

/// The one bucketing rule: units in backward order are added to the open bucket until its
/// parameters times `bytes_per_parameter` reach `limit` (the last unit closes the last bucket).
/// DDP / Megatron: bytes_per_parameter = the dtype size, limit = dp_bucket_size in bytes;
/// DeepSpeed ZeRO: bytes_per_parameter = 1, limit = reduce_bucket_size in elements.
UnitBuckets bucket_units(const std::vector<GradUnit>& units, std::int64_t bytes_per_parameter,
                         std::int64_t limit);

/// The units with only their dense parameters (GradUnit::expert_parameters taken out), and with
/// only their routed experts' (as `parameters`): what the data-parallel and the
/// expert-data-parallel gradient synchronisations reduce.
std::vector<GradUnit> dense_units(const std::vector<GradUnit>& units);
std::vector<GradUnit> expert_units(const std::vector<GradUnit>& units);

/// A plan's segment with its kernel list and label registered.
struct TemplateStep {
  bool compute;
  bool recompute;
  std::uint32_t kernels;  // compute
  CollectiveKind kind;    // collective
  Bytes bytes;
  std::uint32_t label;
  std::int16_t layer_begin, layer_end;
  Bytes activation_delta;
  const std::vector<int>* grads_done;
  Bytes checkpoint_delta, checkpoint_fetch;
  std::uint32_t checkpoint_out = 0, checkpoint_in = 0;  // copy kernels (activation offload)
  int chain = 0;
  TpAxis axis = TpAxis::tp;  // collective: the tensor-parallel communicator it runs on
  bool ring_step = false;    // a ring exchange step over the tp group (Segment::ring_step)
  std::int16_t sms = kNcclSms;
};

/// A part's (and slice's) plan with its kernel lists and labels registered in the program once.
struct StageTemplate {
  StagePlan plan;  // split_backward() of the spec's plan when the schedule splits backwards
  std::vector<TemplateStep> forward, backward, weight;
  /// Backward segments [0, recompute_prefix) recompute forward work before any gradient is
  /// needed; a schedule with recompute passes (Merak) runs them apart, and B from b_begin.
  std::size_t recompute_prefix = 0, b_begin = 0;
  PassKind grad_kind = PassKind::backward;  // the pass whose segments complete gradient units
  Bytes stash;  // activations one forward leaves stored (PipeDream-2BW's carried backwards)
  std::uint32_t recv_activation = 0, send_activation = 0, recv_gradient = 0, send_gradient = 0;
  std::int64_t shard = 0;  // parameters whose optimizer states this rank keeps
  /// Of the plan's parameters, the routed experts' (sharded over the expert-data-parallel
  /// group, spec.expert_dp(), instead of dp).
  std::int64_t expert_parameters = 0;
};

/// The segments a pass runs: [begin, end) of its template's forward, backward or weight list.
struct SegmentRange {
  const std::vector<TemplateStep>* steps;
  std::size_t begin, end;
};

/// What the lowering of one PipelineSpec shares across ranks.
struct Assembly {
  /// Makes the schedule, the program, its groups and the templates (in part-major, slice-minor
  /// order, as PipelineSpec::stages). Throws std::invalid_argument when the spec's plans do not
  /// match the schedule's parts and slices.
  explicit Assembly(const PipelineSpec& spec);

  const PipelineSpec& spec;
  const Schedule schedule;
  Program program;
  const Communicators groups;
  std::vector<StageTemplate> templates;
  const int slices;                 // Schedule::slices
  const std::int64_t element_size;  // bytes of one parameter element (spec.dtype)
  /// Bytes of one gradient-buffer element (spec.grad_dtype, else spec.dtype): what gradients
  /// are accumulated and reduced in.
  const std::int64_t grad_element_size;
  const DType grad_dtype;
  bool separate_recompute = false;  // recompute passes of their own (Merak)

  /// The template chunk `chunk` runs for `unit` (its part's plan, for the unit's slice).
  std::size_t index_of(int chunk, int unit) const;
  const StageTemplate& at(int chunk, int unit) const { return templates[index_of(chunk, unit)]; }
  const StageTemplate& of(const Pass& pass) const { return at(pass.chunk, pass.microbatch); }
  SegmentRange range_of(const Pass& pass) const;
  /// Parameters of `parameters` a rank keeps under ZeRO sharding: ceil(parameters / dp).
  std::int64_t shard_of(std::int64_t parameters) const;
  /// Model states a rank holds for a template: device_model_states of its dense parameters over
  /// dp plus, with MoE, of its experts' over the expert-data-parallel group.
  DeviceModelStates model_states(const StageTemplate& st) const;
  /// What one pipeline send (and its receive) moves per rank for a boundary tensor of
  /// `boundary` bytes: all of it, or ceil(boundary / tp) with
  /// PipelineSpec::pipeline_scatter_gather.
  Bytes pipeline_message(Bytes boundary) const;
  /// Registers a one-kernel list copying `bytes` from tier `from` to tier `to`.
  std::uint32_t copy_kernels(std::int64_t bytes, MemoryTier from, MemoryTier to, std::string name);
};

}  // namespace stratasim::strategies
