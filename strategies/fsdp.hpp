// PyTorch FSDP (FullyShardedDataParallel, torch.distributed.fsdp, "FSDP1") as it runs: the
// settings an experiment gives under training.fsdp (or a --fsdp file gives as llm-foundry /
// Composer write them), with PyTorch's semantics and defaults. What the lowering issues for them
// is FsdpRuntime (strategies/lowering/techniques.hpp); docs/frameworks.md has the table.
//
// Sources: torch/distributed/fsdp/api.py (ShardingStrategy, BackwardPrefetch, MixedPrecision),
// _runtime_utils.py (_unshard, _reshard, _pre_forward_unshard, _pre_backward_hook,
// _post_backward_hook, _post_backward_reshard, _reduce_grad), _limiter_utils.py
// (_FreeEventQueue); Composer's composer/distributed/mosaic_parallelism.py (get_mixed_precision:
// the PURE / DEFAULT / FULL modes llm-foundry's fsdp_config names) and its FSDPConfig defaults.
//
// - sharding_strategy: FULL_SHARD (parameters, gradients and optimizer states sharded over the
//   data-parallel group; each unit's parameters all-gathered before its forward and again before
//   its backward, freed after each), SHARD_GRAD_OP (gathered before forward and kept until the
//   unit's backward ends: no second gather), HYBRID_SHARD (FULL_SHARD within a node — the shard
//   group, the data-parallel ranks of one node — and replicated across nodes: the reduce-scattered
//   shard is then all-reduced over the replicate group), NO_SHARD (DDP: nothing sharded, each
//   unit's gradients all-reduced after its backward).
// - wrap: "block" (each transformer layer an FSDP unit, the embedding, final norm and head the
//   root unit: llm-foundry's MPTBlock fsdp_wrap_fn, torchtitan's per-block fully_shard), or
//   "model" (one unit, the root, for the whole model: no auto-wrap policy). The root unit's
//   parameters are not freed after forward (_post_forward_reshard skips the root).
// - backward_prefetch: BACKWARD_PRE (PyTorch's default: the next unit's all-gather is issued in
//   the current unit's pre-backward hook, before its gradient computation), BACKWARD_POST
//   (issued in the post-backward hook, after it: Composer's default), NONE (each unit gathers in
//   its own pre-backward hook, behind the previous unit's reduce-scatter on the one NCCL stream).
// - forward_prefetch: the next unit's all-gather issued in the current unit's pre-forward hook
//   (default false).
// - limit_all_gathers: the rate limiter (_FreeEventQueue with two slots): before an all-gather
//   the CPU waits (event.synchronize) for the oldest free of a resharded unit once two frees are
//   pending, so at most two (three with prefetching) units are unsharded at a time and the CPU
//   cannot run ahead of the GPU (PyTorch >= 2.1 defaults it to true; llm-foundry's yamls set it).
// - mixed precision: param_dtype (what is all-gathered and computed in), reduce_dtype (what
//   gradients are reduce-scattered in: fp32 doubles a bf16 run's bytes), buffer_dtype (buffers:
//   a GPT has none that cost anything; accepted and reported). Composer's modes, with t the
//   training dtype: PURE = t, t, t; DEFAULT = t, fp32, t (Composer's and llm-foundry's default);
//   FULL = fp32, fp32, fp32. The sharded parameters stay fp32 (the master weights), so model
//   states are 16 bytes per sharded parameter whatever the mode (docs/frameworks.md).
// - unit_host_time: the CPU time of one unit's FSDP hooks in one pass (pre-forward + post-forward,
//   or pre-backward + post-backward), half in each: 200 us by default. PyTorch PR #96958
//   (FSDP "Reduce CPU overhead", 2023) measured unshard 4.3 ms, writeback 1.1 ms and reshard
//   2.8 ms for one FSDP unit of 400 parameter tensors, about 20 us per tensor; a GPT block has
//   about 10 (weights, biases, norms) with use_orig_params, Composer's default.
#pragma once

#include <optional>
#include <string_view>

#include "hw_models/config_reader.hpp"
#include "hw_models/dtype.hpp"
#include "hw_models/units.hpp"

namespace stratasim::strategies {

enum class FsdpSharding { full_shard, shard_grad_op, hybrid_shard, no_shard };
std::string_view name_of(FsdpSharding s);  // "FULL_SHARD", ...
enum class FsdpBackwardPrefetch { backward_pre, backward_post, none };
std::string_view name_of(FsdpBackwardPrefetch p);  // "BACKWARD_PRE", "BACKWARD_POST", "NONE"
enum class FsdpWrap { block, model };
std::string_view name_of(FsdpWrap w);  // "block", "model"

/// The per-unit host time of FSDP's hooks (the header says where it comes from).
inline constexpr Time kDefaultFsdpUnitHostTime = Time::us(200);
/// _FreeEventQueue's slots: frees pending before an all-gather waits for the oldest.
inline constexpr int kFsdpInflightAllGathers = 2;

/// Mixed precision with every dtype resolved.
struct FsdpPrecision {
  DType param = DType::bf16, reduce = DType::fp32, buffer = DType::bf16;
};
/// Composer's mixed_precision modes ("PURE", "DEFAULT", "FULL") for training dtype `t`.
std::optional<FsdpPrecision> fsdp_precision_mode(std::string_view mode, DType t);

struct FsdpSpec {
  FsdpSharding sharding = FsdpSharding::full_shard;
  FsdpWrap wrap = FsdpWrap::block;
  FsdpBackwardPrefetch backward_prefetch = FsdpBackwardPrefetch::backward_pre;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;
  FsdpPrecision precision;
  Time unit_host_time = kDefaultFsdpUnitHostTime;
  /// The ZeRO stage whose model states it keeps: 3 when sharded, 0 with NO_SHARD.
  int zero_stage() const { return sharding == FsdpSharding::no_shard ? 0 : 3; }
};

/// The defaults of `training.framework: fsdp` for training dtype `t`: FULL_SHARD, wrap "block",
/// BACKWARD_PRE, no forward prefetch, limit_all_gathers, mixed precision DEFAULT (t, fp32, t).
FsdpSpec fsdp_defaults(DType t);

/// Reads training.fsdp: keys sharding_strategy, wrap, backward_prefetch, forward_prefetch,
/// limit_all_gathers, mixed_precision ("PURE" | "DEFAULT" | "FULL" or {param_dtype,
/// reduce_dtype, buffer_dtype}, each "bf16" | "fp16" | "fp32"; unset ones the training dtype),
/// unit_host_time ("200 us"). Missing keys keep fsdp_defaults(t). Unknown keys and bad values
/// are config errors at their JSON path.
FsdpSpec read_fsdp(config::ObjectReader r, DType t);

}  // namespace stratasim::strategies
