#include "strategies/lowering/pipeline_spec.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "strategies/layer_table.hpp"
#include "strategies/recompute.hpp"
#include "strategies/tp_overlap.hpp"

namespace stratasim::strategies {

RankLayout layout_of(const Experiment& e) {
  const ParallelismSpec& p = e.parallelism;
  return RankLayout{p.tp, p.dp * p.cp, p.pp, p.cp};
}

ContextParallel context_parallel_of(const Experiment& e) {
  return ContextParallel{e.parallelism.cp, e.parallelism.cp_mode};
}

std::pair<int, int> stage_layers(int layers, int stages, int stage) {
  const int base = layers / stages, extra = layers % stages;
  const int begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

LayerSetting layer_setting(const Experiment& e) {
  LayerSetting s;
  s.tp = e.parallelism.tp;
  s.tp_mode = e.parallelism.tp_mode;
  s.tp_depth = e.parallelism.tp_depth;
  s.sequence_parallel = e.parallelism.sequence_parallel;
  s.micro_batch = e.parallelism.micro_batch;
  s.seq_len = e.training.seq_len / std::max(1, e.parallelism.cp);
  s.dtype = e.training.dtype;
  s.flash_attention = e.training.flash_attention;
  s.attention_kernel = e.training.attention_kernel;
  if (e.training.low_precision) {
    s.low_precision = e.training.low_precision;
    s.quantised_directions = quantised_directions(*e.training.low_precision, e.cluster.device);
    s.te_fused_modules = s.weight_cache = e.training.framework == Framework::megatron;
    s.amax_reduction_ranks =
        e.parallelism.tp * std::max(1, e.parallelism.cp) * std::max(1, e.parallelism.dp);
  }
  // ZeRO-3 gathers each layer before its first op; FSDP also reduces each unit after its last.
  s.split_layers = e.parallelism.zero == 3 || e.training.fsdp.has_value();
  s.moe = MoeSetting{e.parallelism.ep,
                     e.parallelism.etp,
                     e.parallelism.moe_allgather_dispatcher,
                     e.parallelism.moe_shared_expert_overlap,
                     e.parallelism.moe_grouped_gemm,
                     e.parallelism.moe_fp8_dispatch};
  return s;
}

ZeroSettings zero_settings(const Experiment& e) {
  const ParallelismSpec& p = e.parallelism;
  ZeroSettings z;
  z.stage = effective_zero_stage(e);
  z.prefetch_layers = p.zero_prefetch_layers;
  z.prefetch_bucket_size = p.zero_prefetch_bucket_size;
  z.max_live_parameters = p.zero_max_live_parameters;
  z.reduce_bucket_size = p.reduce_bucket_size;
  z.allgather_bucket_size = p.allgather_bucket_size;
  if (p.zero == 0 && z.stage == 1) {
    // Megatron's distributed optimizer: its DDP buckets, one bucket without overlap.
    const std::int64_t bucket =
        p.dp_overlap ? std::max<std::int64_t>(40'000'000, std::int64_t{1'000'000} * p.dp * p.cp)
                     : std::int64_t{1} << 50;
    z.reduce_bucket_size = bucket;
    z.allgather_bucket_size = bucket;
  }
  if (e.training.fsdp && e.training.fsdp->sharding == FsdpSharding::hybrid_shard) {
    z.shard_group = fsdp_shard_group(e);
  }
  z.offload_optimizer = p.offload.optimizer;
  z.offload_params = p.offload.params;
  z.nvme = p.offload.nvme;
  z.offload_activations = p.offload.activations;
  z.overlap_param_gather = p.overlap_param_gather && z.stage == 1;
  z.quantized_weights = p.zero_quantized_weights;
  z.hpz_partition_size = p.zero_hpz_partition_size;
  z.quantized_gradients = p.zero_quantized_gradients;
  if (z.quantized_gradients) {
    z.node_ranks =
        std::gcd(std::max(1, p.dp), std::max(1, e.cluster.devices_per_node / std::max(1, p.tp)));
  }
  return z;
}

DeviceModelStates device_model_states(const ZeroSettings& zero, const ModelStateFormat& format,
                                      std::int64_t parameters, int dp,
                                      std::int64_t low_precision_parameters) {
  const StateBytes state = state_bytes_per_parameter(format);
  const int d = zero.shard_degree(dp);
  const std::int64_t shard = zero.stage == 0 || d <= 1 ? parameters : (parameters + d - 1) / d;
  const bool params_off = zero.stage == 3 && zero.offload_params;
  const std::int64_t params = zero.stage == 3 ? shard : parameters;
  std::int64_t grads = zero.stage <= 1 ? parameters : shard;
  if (zero.offload_optimizer && zero.stage >= 2) grads = 0;  // only transient buckets
  DeviceModelStates states{
      Bytes(params_off ? 0 : params * state.parameters), Bytes(grads * state.gradients),
      zero.offload_optimizer ? Bytes(0) : optimizer_state_bytes(format, shard), Bytes(0)};
  if (format.low_precision && low_precision_parameters > 0 && !params_off && parameters > 0) {
    // The held linear weights (their share of the parameters held) and their quantised copies.
    const std::int64_t held = low_precision_parameters * params / parameters;
    states.parameters +=
        weight_copy_bytes(*format.low_precision, format.quantised_directions, held);
    if (format.low_precision->param_gather) states.parameters -= Bytes(held * state.parameters);
  }
  if (zero.stage == 3 && zero.hpz_partition_size > 1 && dp > 1) {
    states.hpz_secondary = hpz_secondary_bytes(zero, parameters, size_of(format.dtype));
  }
  return states;
}

Bytes hpz_secondary_bytes(const ZeroSettings& zero, std::int64_t parameters,
                          std::int64_t element_size) {
  const std::int64_t n = std::max(1, zero.hpz_partition_size);
  const std::int64_t slice = (parameters + n - 1) / n;
  return Bytes(zero.quantized_weights ? zeropp_quantized_bytes(slice, 8) : slice * element_size);
}

int part_device(ScheduleKind kind, int part, int stages) {
  switch (kind) {
    case ScheduleKind::interleaved:
      return part % stages;
    case ScheduleKind::zb_v:
      return part < stages ? part : 2 * stages - 1 - part;
    default:
      return part;
  }
}

std::vector<int> part_layer_counts(const Experiment& e, int parts) {
  if (e.parallelism.partition.kind == PartitionKind::balanced) {
    throw std::invalid_argument(
        "a balanced partition needs layer costs: lower it with study::lower (study/study.hpp)");
  }
  const PartitionSpec& partition = e.parallelism.partition;
  if (partition.kind == PartitionKind::explicit_) {
    if (static_cast<int>(partition.layers_per_stage.size()) != parts) {
      throw std::invalid_argument("partition lists " +
                                  std::to_string(partition.layers_per_stage.size()) +
                                  " stages, the schedule has " + std::to_string(parts));
    }
    return partition.layers_per_stage;
  }
  std::vector<int> counts;
  for (int part = 0; part < parts; ++part) {
    auto [begin, end] = stage_layers(e.model.layers, parts, part);
    counts.push_back(end - begin);
  }
  return counts;
}

PipelineSpec pipeline_spec(const Experiment& e) {
  return pipeline_spec(
      e, part_layer_counts(
             e, schedule_parts(e.parallelism.schedule, e.parallelism.pp, schedule_options(e))));
}

ScheduleOptions schedule_options(const Experiment& e) {
  return ScheduleOptions{e.parallelism.virtual_stages, e.parallelism.sequence_slices,
                         e.parallelism.pipeline_batched_p2p, e.parallelism.dualpipe_overlap};
}

PipelineSpec pipeline_spec(const Experiment& e, const std::vector<int>& layers_per_part) {
  PipelineSpec spec;
  spec.layout = layout_of(e);
  spec.schedule = e.parallelism.schedule;
  spec.schedule_options = schedule_options(e);
  spec.microbatches = static_cast<int>(e.microbatches());
  spec.dtype = e.training.dtype;
  const ModelStateFormat format = model_state_format(e);
  spec.grad_dtype = format.grad_dtype;
  spec.optimizer = format.optimizer;
  spec.fp32_grad_copy = format.fp32_grad_copy;
  spec.low_precision = format.low_precision;
  spec.quantised_directions = format.quantised_directions;
  spec.dp_bucket_size = e.parallelism.dp_bucket_size;
  spec.dp_overlap = e.parallelism.dp_overlap;
  spec.parameter_servers = e.parallelism.servers;
  spec.ps_slice_parameters = e.parallelism.slice_parameters;
  spec.grad_compression = e.parallelism.grad_compression;
  spec.tp_mode = e.parallelism.tp_mode;
  spec.tp_depth = e.parallelism.tp_depth;
  if (e.model.moe && !e.layer_table) spec.moe = layer_setting(e).moe;
  spec.pipeline_scatter_gather = e.parallelism.pipeline_scatter_gather && spec.layout.tp > 1 &&
                                 !e.parallelism.sequence_parallel && spec.tp_mode == TpMode::one_d;
  spec.zero = zero_settings(e);
  spec.fsdp = e.training.fsdp;
  spec.grad_clip = e.training.grad_clip;
  spec.loss_scaling = e.training.loss_scaling;
  spec.step_overhead = e.training.step_overhead;
  spec.microbatch_overhead = e.training.microbatch_overhead;
  const int p = spec.layout.pp;
  const ScheduleKind kind = spec.schedule;
  // Tied embeddings are synchronised between the devices of the first and the last part; ZB-V
  // puts both on device 0 and every Chimera (and DualPipe) end device holds both.
  spec.shared_embedding =
      e.model.tied_embeddings && p > 1 && kind != ScheduleKind::zb_v && !holds_parts_twice(kind);
  const std::int64_t rows = (std::int64_t{e.model.vocab} + spec.layout.tp - 1) / spec.layout.tp;
  // Megatron all-reduces the word embeddings' main_grad: in the gradient buffers' dtype.
  spec.embedding_sync_bytes = Bytes(rows * e.model.hidden * size_of(format.grad_dtype));
  const int parts = static_cast<int>(layers_per_part.size());
  if (e.layer_table) {
    // A layer table: each part's layers as the table gives them; Zero Bubble's W keeps what
    // the table says the weight gradients need.
    spec.shared_embedding = false;
    spec.embedding_sync_bytes = Bytes(0);
    const LayerTableSetting table_setting{e.parallelism.micro_batch, e.training.dtype};
    int begin = 0;
    for (int part = 0; part < parts; ++part) {
      const int end = begin + layers_per_part[static_cast<std::size_t>(part)];
      StagePlan plan = plan_layer_table_stage(*e.layer_table, table_setting, begin, end);
      for (Segment& b : plan.backward) {
        if (b.layer_begin >= 0) {
          b.weight_grad_bytes = weight_grad_bytes(*e.layer_table, table_setting, b.layer_begin);
        }
      }
      spec.stages.push_back(std::move(plan));
      begin = end;
    }
    return spec;
  }
  const LayerSetting setting = layer_setting(e);
  // Stage-aware recomputation fits what is left beside the model state ZeRO keeps.
  const std::vector<StageRecompute> recompute = recompute_plan(e, [&spec](int,
                                                                          std::int64_t parameters) {
    return device_model_states(spec.zero, spec.state_format(), parameters, spec.state_dp()).total();
  });
  const int sub_batches = e.parallelism.tp_overlap;
  const int slices = kind == ScheduleKind::terapipe ? spec.schedule_options.sequence_slices : 1;
  int begin = 0;
  for (int part = 0; part < parts; ++part) {
    const int end = begin + layers_per_part[static_cast<std::size_t>(part)];
    const StageRecompute& r = recompute[static_cast<std::size_t>(part_device(kind, part, p))];
    for (int slice = 0; slice < slices; ++slice) {
      LayerSetting sliced = setting;
      sliced.seq_len = setting.seq_len / slices;
      sliced.context_len = slice * sliced.seq_len;
      StagePlan plan = sub_batches > 1
                           ? plan_transformer_stage_sub_pipelined(e.model, sliced, part, parts,
                                                                  begin, end, r, sub_batches)
                           : plan_transformer_stage(e.model, sliced, part, parts, begin, end, r);
      if (e.parallelism.tp_comm_overlap) plan = tp_comm_overlap(plan, setting.tp);
      plan = context_parallel(plan, context_parallel_of(e));
      spec.stages.push_back(std::move(plan));
    }
    begin = end;
  }
  return spec;
}

std::vector<SpecProblem> technique_problems(const ZeroSettings& zero,
                                            const GradCompression& compression,
                                            ScheduleKind schedule, int dp) {
  std::vector<SpecProblem> problems;
  // ZeRO++ refines ZeRO-3's collectives (DeepSpeed reads its keys in stage 3 only).
  const std::pair<bool, const char*> zeropp[] = {
      {zero.quantized_weights, "zero_quantized_weights"},
      {zero.hpz_partition_size > 1, "zero_hpz_partition_size"},
      {zero.quantized_gradients, "zero_quantized_gradients"}};
  for (auto [on, key] : zeropp) {
    if (on && zero.stage != 3) {
      problems.push_back({std::string("parallelism.") + key,
                          std::string("ZeRO++ (") + key +
                              ") refines ZeRO-3's gathers and reductions: it needs "
                              "parallelism.zero 3, got ZeRO stage " +
                              std::to_string(zero.stage)});
    }
  }
  if (zero.hpz_partition_size < 1) {
    problems.push_back({"parallelism.zero_hpz_partition_size", "must be at least 1 (1: off)"});
  } else if (zero.hpz_partition_size > 1 && dp > 0 && dp % zero.hpz_partition_size != 0) {
    problems.push_back(
        {"parallelism.zero_hpz_partition_size",
         "hpZ partitions the parameters within groups of " +
             std::to_string(zero.hpz_partition_size) +
             " data-parallel ranks: it must divide the data-parallel degree (parallelism.dp " +
             std::to_string(dp) + ")"});
  }
  if (zero.stage < 0 || zero.stage > 3) {
    problems.push_back(
        {"parallelism.zero", "ZeRO stage " + std::to_string(zero.stage) + " (expected 0 to 3)"});
  }
  if (zero.prefetch_layers < 0) {
    problems.push_back({"parallelism.zero_prefetch_layers", "must not be negative"});
  }
  if (zero.reduce_bucket_size <= 0) {
    problems.push_back({"parallelism.reduce_bucket_size", "must be positive (elements)"});
  }
  if (zero.allgather_bucket_size <= 0) {
    problems.push_back({"parallelism.allgather_bucket_size", "must be positive (elements)"});
  }
  if (zero.offload_params && zero.stage != 3) {
    problems.push_back({"parallelism.offload",
                        "\"params\" offload needs ZeRO stage 3 (parallelism.zero = 3): parameter "
                        "offload keeps the ZeRO-3 parameter shard on the host"});
  }
  if (zero.nvme && !zero.offload_optimizer && !zero.offload_params) {
    problems.push_back({"parallelism.offload",
                        "\"nvme\" says where offloaded optimizer states or parameters go; "
                        "offload \"optimizer\" or \"params\" with it"});
  }
  if (zero.offload_optimizer && zero.stage == 0) {
    problems.push_back({"parallelism.offload",
                        "optimizer offload is ZeRO-Offload: it needs parallelism.zero >= 1"});
  }
  if (compression.enabled() && zero.stage > 0) {
    problems.push_back(
        {"parallelism.grad_compression",
         "compressed gradient synchronisation replaces the dense data-parallel all-reduce "
         "of ZeRO stage 0; ZeRO stage " +
             std::to_string(zero.stage) +
             " reduce-scatters gradient shards instead, which is not modelled compressed "
             "(use parallelism.zero 0 or grad_compression \"none\")"});
  }
  if (holds_parts_twice(schedule) && (zero.stage == 3 || zero.shard_group > 0)) {
    problems.push_back({"parallelism.zero", std::string(name_of(schedule)) +
                                                " holds every stage on two devices; ZeRO stage 3 "
                                                "and hybrid sharding with it are not modelled "
                                                "(use 0, 1 or 2)"});
  }
  return problems;
}

}  // namespace stratasim::strategies
