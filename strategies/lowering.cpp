#include "strategies/lowering.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

#include "strategies/recompute.hpp"
#include "strategies/schedule.hpp"
#include "strategies/tp_overlap.hpp"
#include "strategies/weight_split.hpp"

namespace stratasim::strategies {

RankLayout layout_of(const Experiment& e) {
  return RankLayout{e.parallelism.tp, e.parallelism.dp, e.parallelism.pp};
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
  s.seq_len = e.training.seq_len;
  s.dtype = e.training.dtype;
  s.flash_attention = e.training.flash_attention;
  s.split_layers = e.parallelism.zero == 3;  // ZeRO-3 gathers each layer before its first op
  return s;
}

StateBytes state_bytes_per_parameter(DType dtype) {
  if (dtype == DType::fp32) return {4, 4, 8};
  return {size_of(dtype), size_of(dtype), 12};
}

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// A gradient unit's parameters as used by one pass (ZeRO-3 gathers them before `first` and
// releases them after `last`).
struct Use {
  int unit;   // index into StagePlan::grad_units
  int first;  // first step of the pass that touches the unit
  int last;   // last compute step touching it (last step at all when none computes)
};

// Which steps of a pass touch which gradient unit's parameters: a unit named "L<l>" (the
// transformer lowering's layer units) the steps covering layer l; "embedding" the steps up to
// the first layer step in forward (from the last one in backward) and "head" the mirror image
// (merged compute ops may hold the boundary layer's kernels too, so the boundary step counts for
// both); any other unit, every step.
std::vector<Use> parameter_uses(const std::vector<Segment>& steps,
                                const std::vector<GradUnit>& units, bool forward) {
  const int n = static_cast<int>(steps.size());
  int first_layer = -1, last_layer = -1;
  for (int i = 0; i < n; ++i) {
    if (steps[static_cast<std::size_t>(i)].layer_begin < 0) continue;
    if (first_layer < 0) first_layer = i;
    last_layer = i;
  }
  std::vector<Use> uses;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const std::string& name = units[static_cast<std::size_t>(u)].name;
    int layer = -1;
    if (name.size() > 1 && name[0] == 'L' &&
        name.find_first_not_of("0123456789", 1) == std::string::npos) {
      layer = std::stoi(name.substr(1));
    }
    const bool embedding = name == "embedding", head = name == "head";
    auto touches = [&](int i) {
      const Segment& s = steps[static_cast<std::size_t>(i)];
      if (layer >= 0) return s.layer_begin <= layer && layer < s.layer_end;
      if (first_layer < 0) return true;
      if (embedding) return forward ? i <= first_layer : i >= last_layer;
      if (head) return forward ? i >= last_layer : i <= first_layer;
      return true;
    };
    Use use{u, -1, -1};
    int last_any = -1;
    for (int i = 0; i < n; ++i) {
      if (!touches(i)) continue;
      if (use.first < 0) use.first = i;
      last_any = i;
      if (steps[static_cast<std::size_t>(i)].compute) use.last = i;
    }
    if (use.first < 0) continue;
    if (use.last < 0) use.last = last_any;
    uses.push_back(use);
  }
  // Units come in backward order (head, last layer to first, embedding): ties between units
  // first touched by one merged op go in the order the pass runs them.
  std::sort(uses.begin(), uses.end(), [forward](const Use& a, const Use& b) {
    const int ua = forward ? -a.unit : a.unit, ub = forward ? -b.unit : b.unit;
    return std::tie(a.first, a.last, ua) < std::tie(b.first, b.last, ub);
  });
  return uses;
}

// Gradient units grouped into reduce buckets, in the order backward completes them.
struct Bucket {
  int first_unit, last_unit;
  std::int64_t parameters;
  std::uint32_t copy_kernels;  // the reduced shard to the host (optimizer offload)
  std::uint32_t reduce_label, copy_label;
};

// A stage's plan with its kernel lists and labels registered in the program once.
struct StageTemplate {
  struct Step {
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
  };
  StagePlan plan;
  std::vector<Step> forward, backward, weight;
  // Backward segments [0, recompute_prefix) recompute forward work before any gradient is
  // needed; a schedule with recompute passes (Merak) runs them apart, and B from b_begin.
  std::size_t recompute_prefix = 0, b_begin = 0;
  PassKind grad_kind = PassKind::backward;  // the pass whose segments complete gradient units
  Bytes stash;  // activations one forward leaves stored (PipeDream-2BW's carried backwards)
  std::uint32_t recv_activation, send_activation, recv_gradient, send_gradient;
  std::uint32_t optimizer_kernels;
  std::int64_t shard = 0;  // parameters whose optimizer states this rank keeps

  // ZeRO-3: parameter uses per pass, and per unit its gather's label and the copy of its shard
  // to the device (parameter offload).
  std::vector<Use> forward_uses, backward_uses, recompute_uses;
  std::vector<std::uint32_t> gather_label, fetch_label, fetch_kernels;
  std::vector<std::int16_t> unit_layer;
  // Reduce buckets (ZeRO stages 1-3) and the unit -> bucket map.
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of_unit;
  // Stages 1 and 2: the post-step all-gather buckets (elements) and, with optimizer offload, the
  // copies of their shards to the device.
  std::vector<std::int64_t> gather_buckets;
  std::vector<std::uint32_t> gather_bucket_label, gather_bucket_copy, gather_bucket_copy_label;
  // Optimizer offload and NVMe: copies around the host step.
  std::uint32_t states_in = 0, states_out = 0, params_back = 0;
  std::uint32_t states_in_label = 0, states_out_label = 0, params_back_label = 0;
  bool params_back_needed = false;
  // Compressed gradient synchronisation (ZeRO stage 0): the data-parallel buckets (as the dense
  // all-reduce forms them), each unit's bucket, and per bucket its steps with their kernel lists
  // registered once; `head` steps (up to the first collective) may run inside the backward.
  struct DpSync {
    int first_unit = 0, last_unit = 0;
    CompressedSync sync;
    std::vector<std::uint32_t> kernels;  // per step (compute steps)
    std::size_t head = 0;
  };
  std::vector<DpSync> dp_sync;
  std::vector<int> dp_sync_of_unit;
  Bytes residual;  // error feedback of every bucket (top-k)
};

std::vector<StageTemplate::Step> register_steps(Program& program,
                                                const std::vector<Segment>& segments) {
  std::vector<StageTemplate::Step> steps;
  for (const auto& s : segments) {
    steps.push_back({s.compute, s.recompute, s.compute ? program.add_kernels(s.kernels) : 0,
                     s.collective, s.bytes, program.intern_label(s.label),
                     static_cast<std::int16_t>(s.layer_begin),
                     static_cast<std::int16_t>(s.layer_end), s.activation_delta, &s.grads_done,
                     s.checkpoint_delta, s.checkpoint_fetch});
    auto& step = steps.back();
    step.chain = s.chain;
    step.axis = s.axis;
    if (s.checkpoint_delta.count() > 0) {
      step.checkpoint_out = program.add_kernels({Kernel{
          Copy{s.checkpoint_delta, MemoryTier::device, MemoryTier::host}, "checkpoint.d2h"}});
    }
    if (s.checkpoint_fetch.count() > 0) {
      step.checkpoint_in = program.add_kernels({Kernel{
          Copy{s.checkpoint_fetch, MemoryTier::host, MemoryTier::device}, "checkpoint.h2d"}});
    }
  }
  return steps;
}

}  // namespace

ZeroSettings zero_settings(const Experiment& e) {
  const ParallelismSpec& p = e.parallelism;
  ZeroSettings z;
  z.stage = p.zero;
  z.prefetch_layers = p.zero_prefetch_layers;
  z.reduce_bucket_size = p.reduce_bucket_size;
  z.allgather_bucket_size = p.allgather_bucket_size;
  z.offload_optimizer = p.offload.optimizer;
  z.offload_params = p.offload.params;
  z.nvme = p.offload.nvme;
  z.offload_activations = p.offload.activations;
  return z;
}

DeviceModelStates device_model_states(const ZeroSettings& zero, DType dtype,
                                      std::int64_t parameters, int dp) {
  const StateBytes state = state_bytes_per_parameter(dtype);
  const std::int64_t shard = zero.stage == 0 || dp <= 1 ? parameters : (parameters + dp - 1) / dp;
  const bool params_off = zero.stage == 3 && zero.offload_params;
  const std::int64_t params = zero.stage == 3 ? shard : parameters;
  std::int64_t grads = zero.stage <= 1 ? parameters : shard;
  if (zero.offload_optimizer && zero.stage >= 2) grads = 0;  // only transient buckets
  return DeviceModelStates{Bytes(params_off ? 0 : params * state.parameters),
                           Bytes(grads * state.gradients),
                           Bytes(zero.offload_optimizer ? 0 : shard * state.optimizer)};
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
  return ScheduleOptions{e.parallelism.virtual_stages, e.parallelism.sequence_slices};
}

PipelineSpec pipeline_spec(const Experiment& e, const std::vector<int>& layers_per_part) {
  PipelineSpec spec;
  spec.layout = layout_of(e);
  spec.schedule = e.parallelism.schedule;
  spec.schedule_options = schedule_options(e);
  spec.microbatches = static_cast<int>(e.microbatches());
  spec.dtype = e.training.dtype;
  spec.dp_bucket_size = e.parallelism.dp_bucket_size;
  spec.dp_overlap = e.parallelism.dp_overlap;
  spec.grad_compression = e.parallelism.grad_compression;
  spec.tp_mode = e.parallelism.tp_mode;
  spec.tp_depth = e.parallelism.tp_depth;
  spec.zero = zero_settings(e);
  const int p = spec.layout.pp;
  const ScheduleKind kind = spec.schedule;
  // Tied embeddings are synchronised between the devices of the first and the last part; ZB-V
  // puts both on device 0 and every Chimera end device holds both.
  spec.shared_embedding = e.model.tied_embeddings && p > 1 && kind != ScheduleKind::zb_v &&
                          kind != ScheduleKind::chimera;
  const std::int64_t rows = (std::int64_t{e.model.vocab} + spec.layout.tp - 1) / spec.layout.tp;
  spec.embedding_sync_bytes = Bytes(rows * e.model.hidden * size_of(e.training.dtype));
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
  const std::vector<StageRecompute> recompute =
      recompute_plan(e, [&spec, &e](int, std::int64_t parameters) {
        return device_model_states(spec.zero, e.training.dtype, parameters, spec.layout.dp).total();
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
      spec.stages.push_back(
          sub_batches > 1 ? plan_transformer_stage_sub_pipelined(e.model, sliced, part, parts,
                                                                 begin, end, r, sub_batches)
                          : plan_transformer_stage(e.model, sliced, part, parts, begin, end, r));
    }
    begin = end;
  }
  return spec;
}

Program lower(const Experiment& e, const LowerOptions& options) {
  PipelineSpec spec = pipeline_spec(e);
  spec.mirror_data_parallel = options.mirror_data_parallel;
  spec.mirror_tensor_parallel = options.mirror_tensor_parallel;
  return assemble_pipeline(spec);
}

Program assemble_pipeline(const PipelineSpec& spec) {
  const RankLayout layout = spec.layout;
  const int world = layout.world_size();
  const int m = spec.microbatches;
  const int dp = layout.dp;
  const DType dtype = spec.dtype;
  const std::int64_t e = size_of(dtype);
  const StateBytes state = state_bytes_per_parameter(dtype);
  const ZeroSettings& zero = spec.zero;
  const Schedule schedule = make_schedule(spec.schedule, layout.pp, m, spec.schedule_options);
  const int slices = schedule.slices;
  const std::size_t template_count =
      static_cast<std::size_t>(schedule.parts) * static_cast<std::size_t>(slices);
  if (spec.stages.size() != template_count) {
    throw std::invalid_argument("assemble_pipeline: " + std::to_string(spec.stages.size()) +
                                " stage plans for " + std::to_string(schedule.parts) +
                                " model parts" +
                                (slices > 1 ? " of " + std::to_string(slices) + " slices" : ""));
  }
  if (zero.stage < 0 || zero.stage > 3) {
    throw std::invalid_argument("assemble_pipeline: ZeRO stage " + std::to_string(zero.stage) +
                                " (expected 0 to 3)");
  }
  if (!schedule.replica_device.empty() && zero.stage > 0) {
    throw std::invalid_argument("assemble_pipeline: " + std::string(name_of(schedule.kind)) +
                                " holds every stage twice; ZeRO sharding is not modelled with it");
  }
  if (zero.offload_optimizer && zero.stage == 0) {
    throw std::invalid_argument("assemble_pipeline: optimizer offload needs ZeRO stage >= 1");
  }
  if (zero.offload_params && zero.stage != 3) {
    throw std::invalid_argument("assemble_pipeline: parameter offload needs ZeRO stage 3");
  }
  if (zero.reduce_bucket_size <= 0 || zero.allgather_bucket_size <= 0 || zero.prefetch_layers < 0) {
    throw std::invalid_argument(
        "assemble_pipeline: ZeRO bucket sizes must be positive and the prefetch not negative");
  }
  const bool offload_optimizer = zero.offload_optimizer;
  const MemoryTier offload_tier = zero.nvme ? MemoryTier::nvme : MemoryTier::host;
  // Parameters whose states (stage >= 1), gradients (>= 2) or weights (3) a rank keeps.
  const auto shard_of = [dp](std::int64_t params) {
    return dp > 1 ? ceil_div(params, dp) : params;
  };
  // ZeRO-3 fetches every unit before each use (gathers it, or copies it from the host).
  const bool fetching = zero.stage == 3 && (dp > 1 || zero.offload_params);
  // Stages 2 and 3 reduce every microbatch's gradients through transient buckets.
  const bool per_microbatch = zero.stage >= 2 && (dp > 1 || offload_optimizer);
  const auto ahead = static_cast<std::size_t>(zero.prefetch_layers);
  bool separate_recompute = false;  // recompute passes of their own (Merak)
  for (const auto& passes : schedule.passes) {
    for (const Pass& x : passes) separate_recompute |= x.kind == PassKind::recompute;
  }
  Program program(world);
  program.set_overlapping_iterations(schedule.overlapping_iterations);

  // Communicator groups. A device's gradients are summed over its data-parallel replicas and,
  // with Chimera, over those of the device holding the same parts in the other direction.
  auto replica_device = [&schedule](int device) {
    return schedule.replica_device.empty()
               ? device
               : schedule.replica_device[static_cast<std::size_t>(device)];
  };
  std::vector<std::uint32_t> tp_group(static_cast<std::size_t>(world), 0);
  std::vector<std::uint32_t> dp_group(static_cast<std::size_t>(world), 0);
  std::vector<std::uint32_t> embedding_group(static_cast<std::size_t>(world), 0);
  const int dp_group_size = dp * (schedule.replica_device.empty() ? 1 : 2);
  for (int stage = 0; stage < layout.pp; ++stage) {
    for (int d = 0; d < layout.dp && layout.tp > 1; ++d) {
      std::vector<std::int32_t> ranks;
      for (int t = 0; t < layout.tp; ++t) ranks.push_back(layout.rank(t, d, stage));
      auto id = program.add_group(ranks, "tp s" + std::to_string(stage) + " d" + std::to_string(d));
      for (int r : ranks) tp_group[static_cast<std::size_t>(r)] = id;
    }
    const int partner = replica_device(stage);
    if (partner < stage) continue;  // its group exists already
    for (int t = 0; t < layout.tp && dp_group_size > 1; ++t) {
      std::vector<std::int32_t> ranks;
      for (int d = 0; d < layout.dp; ++d) ranks.push_back(layout.rank(t, d, stage));
      if (partner != stage) {
        for (int d = 0; d < layout.dp; ++d) ranks.push_back(layout.rank(t, d, partner));
      }
      const std::string name = "dp s" + std::to_string(stage) +
                               (partner != stage ? "+s" + std::to_string(partner) : "") + " t" +
                               std::to_string(t);
      auto id = program.add_group(ranks, name);
      for (int r : ranks) dp_group[static_cast<std::size_t>(r)] = id;
    }
  }
  const int first_device = schedule.device_of_chunk.front();
  const int last_device = schedule.device_of_chunk.back();
  const bool shared_embedding = spec.shared_embedding && first_device != last_device;
  if (shared_embedding) {
    for (int d = 0; d < layout.dp; ++d) {
      for (int t = 0; t < layout.tp; ++t) {
        std::vector<std::int32_t> ranks = {layout.rank(t, d, first_device),
                                           layout.rank(t, d, last_device)};
        auto id =
            program.add_group(ranks, "embedding d" + std::to_string(d) + " t" + std::to_string(t));
        for (int r : ranks) embedding_group[static_cast<std::size_t>(r)] = id;
      }
    }
  }
  // Tensor-parallel mesh groups (2D, 2.5D, 3D): every tp group's rows, columns and depth lines
  // (strategies/tp_modes.hpp), made after all others so that 1D programs keep their groups.
  const TpMesh mesh = make_tp_mesh(spec.tp_mode, layout.tp, spec.tp_depth);
  constexpr std::uint32_t kNoGroup = 0xFFFFFFFFu;
  std::array<std::vector<std::uint32_t>, kTpAxisCount> axis_group;
  if (mesh.mode != TpMode::one_d) {
    for (TpAxis axis : {TpAxis::tp_row, TpAxis::tp_col, TpAxis::tp_depth}) {
      if (mesh.axis_size(axis) <= 1) continue;
      auto& groups = axis_group[static_cast<std::size_t>(axis)];
      groups.assign(static_cast<std::size_t>(world), kNoGroup);
      for (int stage = 0; stage < layout.pp; ++stage) {
        for (int d = 0; d < layout.dp; ++d) {
          for (int t = 0; t < layout.tp; ++t) {
            const std::vector<int> members = mesh.axis_members(axis, t);
            if (members.front() != t) continue;  // made by the line's first member
            std::vector<std::int32_t> ranks;
            for (int member : members) ranks.push_back(layout.rank(member, d, stage));
            const auto id =
                program.add_group(ranks, std::string(name_of(axis)) + " s" + std::to_string(stage) +
                                             " d" + std::to_string(d) + " t" + std::to_string(t));
            for (int r : ranks) groups[static_cast<std::size_t>(r)] = id;
          }
        }
      }
    }
  }
  auto tp_group_on = [&](TpAxis axis, std::size_t rank) -> std::uint32_t {
    if (axis == TpAxis::tp) return tp_group[rank];
    const auto& groups = axis_group[static_cast<std::size_t>(axis)];
    if (groups.empty() || groups[rank] == kNoGroup) {
      throw std::invalid_argument("assemble_pipeline: a collective on axis " +
                                  std::string(name_of(axis)) + ", which tp_mode " +
                                  std::string(name_of(mesh.mode)) + " with tp " +
                                  std::to_string(layout.tp) + " does not have");
    }
    return groups[rank];
  };
  const bool compress_dp = spec.grad_compression.enabled() && zero.stage == 0 && dp_group_size > 1;
  if (spec.grad_compression.enabled() && zero.stage > 0) {
    throw std::invalid_argument(
        "assemble_pipeline: gradient compression is modelled with ZeRO stage 0 only");
  }

  // One template per model part (and slice): kernel lists and labels registered once.
  auto copy_kernels = [&](std::int64_t bytes, MemoryTier from, MemoryTier to, std::string name) {
    return program.add_kernels({Kernel{Copy{Bytes(bytes), from, to}, std::move(name)}});
  };
  std::vector<StageTemplate> stages(template_count);
  for (std::size_t s = 0; s < template_count; ++s) {
    auto& st = stages[s];
    st.plan = schedule.split_backward ? split_backward(spec.stages[s]) : spec.stages[s];
    st.forward = register_steps(program, st.plan.forward);
    st.backward = register_steps(program, st.plan.backward);
    st.weight = register_steps(program, st.plan.weight);
    while (st.recompute_prefix < st.plan.backward.size() &&
           st.plan.backward[st.recompute_prefix].recompute) {
      ++st.recompute_prefix;
    }
    st.b_begin = separate_recompute ? st.recompute_prefix : 0;
    st.grad_kind = st.plan.weight.empty() ? PassKind::backward : PassKind::weight;
    for (const Segment& f : st.plan.forward) st.stash += f.activation_delta + f.checkpoint_delta;
    st.recv_activation = program.intern_label("recv activation");
    st.send_activation = program.intern_label("send activation");
    st.recv_gradient = program.intern_label("recv gradient");
    st.send_gradient = program.intern_label("send gradient");
    const auto& units = st.plan.grad_units;
    st.shard = zero.stage == 0 ? st.plan.parameters : shard_of(st.plan.parameters);
    st.optimizer_kernels = program.add_kernels(
        {Kernel{OptimizerStep{st.shard, OptimizerKind::adam, dtype, offload_optimizer},
                offload_optimizer ? "cpu adam" : "adam"}});
    if (zero.stage == 3) {
      const auto b = st.plan.backward.begin();
      st.forward_uses = parameter_uses(st.plan.forward, units, true);
      st.recompute_uses = parameter_uses(
          std::vector<Segment>(b, b + static_cast<std::ptrdiff_t>(st.b_begin)), units, true);
      st.backward_uses = parameter_uses(
          std::vector<Segment>(b + static_cast<std::ptrdiff_t>(st.b_begin), st.plan.backward.end()),
          units, false);
      for (const auto& unit : units) {
        st.gather_label.push_back(program.intern_label("param all-gather " + unit.name));
        st.fetch_label.push_back(program.intern_label("param fetch " + unit.name));
        st.fetch_kernels.push_back(zero.offload_params
                                       ? copy_kernels(shard_of(unit.parameters) * e, offload_tier,
                                                      MemoryTier::device, "param fetch")
                                       : 0);
        std::int16_t layer = -1;
        if (unit.name.size() > 1 && unit.name[0] == 'L' &&
            unit.name.find_first_not_of("0123456789", 1) == std::string::npos) {
          layer = static_cast<std::int16_t>(std::stoi(unit.name.substr(1)));
        }
        st.unit_layer.push_back(layer);
      }
    }
    if (compress_dp) {
      // The dense all-reduce's buckets: units in backward order until dp_bucket_size bytes.
      st.dp_sync_of_unit.assign(units.size(), 0);
      std::int64_t params = 0;
      int first = 0;
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        params += units[static_cast<std::size_t>(u)].parameters;
        st.dp_sync_of_unit[static_cast<std::size_t>(u)] = static_cast<int>(st.dp_sync.size());
        if (params * e < spec.dp_bucket_size.count() && u + 1 < static_cast<int>(units.size())) {
          continue;
        }
        StageTemplate::DpSync b;
        b.first_unit = first;
        b.last_unit = u;
        b.sync = compressed_sync(spec.grad_compression, params, dp_group_size, dtype);
        for (const SyncStep& step : b.sync.steps) {
          b.kernels.push_back(step.compute ? program.add_kernels(step.kernels) : 0);
          if (b.head == 0 && !step.compute) b.head = b.kernels.size();
        }
        st.residual += b.sync.residual;
        st.dp_sync.push_back(std::move(b));
        params = 0;
        first = u + 1;
      }
    }
    if (zero.stage >= 1) {
      st.bucket_of_unit.assign(units.size(), 0);
      std::int64_t params = 0;
      int first = 0;
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        params += units[static_cast<std::size_t>(u)].parameters;
        st.bucket_of_unit[static_cast<std::size_t>(u)] = static_cast<int>(st.buckets.size());
        if (params < zero.reduce_bucket_size && u + 1 < static_cast<int>(units.size())) continue;
        const std::string index = std::to_string(st.buckets.size());
        st.buckets.push_back(
            {first, u, params,
             offload_optimizer ? copy_kernels(shard_of(params) * state.gradients,
                                              MemoryTier::device, MemoryTier::host, "grad to host")
                               : 0,
             program.intern_label("grad reduce-scatter bucket " + index),
             program.intern_label("grad to host bucket " + index)});
        params = 0;
        first = u + 1;
      }
    }
    if (zero.stage == 1 || zero.stage == 2) {
      for (std::int64_t left = st.plan.parameters; left > 0;) {
        const std::int64_t elements = std::min(left, zero.allgather_bucket_size);
        const std::string index = std::to_string(st.gather_buckets.size());
        st.gather_buckets.push_back(elements);
        st.gather_bucket_label.push_back(program.intern_label("param all-gather bucket " + index));
        st.gather_bucket_copy.push_back(offload_optimizer
                                            ? copy_kernels(shard_of(elements) * e, MemoryTier::host,
                                                           MemoryTier::device, "params to device")
                                            : 0);
        st.gather_bucket_copy_label.push_back(
            program.intern_label("params to device bucket " + index));
        left -= elements;
      }
    }
    if (offload_optimizer && zero.nvme) {
      const std::int64_t bytes = st.shard * state.optimizer;
      st.states_in = copy_kernels(bytes, MemoryTier::nvme, MemoryTier::host, "optimizer states in");
      st.states_out =
          copy_kernels(bytes, MemoryTier::host, MemoryTier::nvme, "optimizer states out");
      st.states_in_label = program.intern_label("optimizer states from nvme");
      st.states_out_label = program.intern_label("optimizer states to nvme");
    }
    if (zero.stage == 3) {
      // Where the updated weights go after the step, if they are not written in place.
      const std::int64_t bytes = st.shard * e;
      if (!zero.offload_params && offload_optimizer) {
        st.params_back = copy_kernels(bytes, MemoryTier::host, MemoryTier::device, "params back");
        st.params_back_label = program.intern_label("params to device");
        st.params_back_needed = true;
      } else if (zero.offload_params && !offload_optimizer) {
        st.params_back = copy_kernels(bytes, MemoryTier::device, offload_tier, "params back");
        st.params_back_label =
            program.intern_label(zero.nvme ? "params to nvme" : "params to host");
        st.params_back_needed = true;
      } else if (zero.offload_params && zero.nvme) {
        st.params_back = copy_kernels(bytes, MemoryTier::host, MemoryTier::nvme, "params back");
        st.params_back_label = program.intern_label("params to nvme");
        st.params_back_needed = true;
      }
    }
  }
  const bool offload_activations = spec.zero.offload_activations;
  const std::uint32_t checkpoint_out_label = program.intern_label("checkpoint to host");
  const std::uint32_t checkpoint_in_label = program.intern_label("checkpoint from host");
  const std::uint32_t recv_input_label = program.intern_label("wait for input");
  const std::uint32_t no_kernels = program.add_kernels({});
  const std::vector<Use> no_uses;
  // The template chunk `chunk` runs for `unit` (its part's plan, for the unit's slice).
  auto template_at = [&](int chunk, int unit) -> const StageTemplate& {
    const int part = schedule.part_of_chunk[static_cast<std::size_t>(chunk)];
    return stages[static_cast<std::size_t>(part * slices + unit % slices)];
  };
  auto template_of = [&](const Pass& x) -> const StageTemplate& {
    return template_at(x.chunk, x.microbatch);
  };
  // The segments a pass runs: [begin, end) of its template's forward, backward or weight list.
  struct Range {
    const std::vector<StageTemplate::Step>* steps;
    std::size_t begin, end;
    const std::vector<Use>* uses;
  };
  // What chunk `chunk` sends on for `unit` (its part's output, and the gradient of it).
  auto output_bytes = [&](int chunk, int unit) {
    return template_at(chunk, unit).plan.boundary_bytes;
  };
  auto range_of = [&](const Pass& x) -> Range {
    const StageTemplate& st = template_of(x);
    switch (x.kind) {
      case PassKind::forward:
        return {&st.forward, 0, st.forward.size(), fetching ? &st.forward_uses : &no_uses};
      case PassKind::recompute:
        return {&st.backward, 0, st.b_begin, fetching ? &st.recompute_uses : &no_uses};
      case PassKind::backward:
        return {&st.backward, st.b_begin, st.backward.size(),
                fetching ? &st.backward_uses : &no_uses};
      case PassKind::weight:
        break;
    }
    return {&st.weight, 0, st.weight.size(), &no_uses};
  };
  const bool mirror_tp = spec.mirror_tensor_parallel && spec.tp_mode == TpMode::one_d;
  {
    // Room for every op up front: programs reach tens of millions of ops.
    std::size_t ops = 0, effects = 0;
    const std::size_t fetch_ops = (zero.offload_params ? 1 : 0) + (dp > 1 ? 1 : 0);
    for (int device = 0; device < layout.pp; ++device) {
      std::size_t device_ops = 0, device_effects = 0;
      for (const Pass& x : schedule.passes[static_cast<std::size_t>(device)]) {
        const Range r = range_of(x);
        const StageTemplate& st = template_of(x);
        device_ops += (r.end - r.begin) + 3 + r.uses->size() * fetch_ops;
        device_effects += (r.end - r.begin) + 3 * r.uses->size();
        if (per_microbatch) {
          device_ops += 2 * st.buckets.size();
          device_effects += 2 * st.buckets.size();
        }
      }
      for (int c : schedule.chunks_of(device)) {
        const StageTemplate& st = template_at(c, 0);
        device_ops +=
            st.plan.grad_units.size() + 2 * st.buckets.size() + 2 * st.gather_buckets.size() + 8;
        for (const auto& b : st.dp_sync) device_ops += b.sync.steps.size();
      }
      const auto replicas = static_cast<std::size_t>(mirror_tp ? 1 : layout.tp) *
                            static_cast<std::size_t>(spec.mirror_data_parallel ? 1 : layout.dp);
      ops += replicas * device_ops;
      effects += replicas * device_effects;
    }
    program.reserve(ops, 2 * ops, effects);
  }
  const std::uint32_t optimizer_label = program.intern_label("optimizer step");
  const std::uint32_t host_optimizer_label = program.intern_label("optimizer step (host)");
  const std::uint32_t embedding_sync_label = program.intern_label("embedding grad all-reduce");
  constexpr OpId kNoOp = 0xFFFFFFFFu;
  // PipeDream-2BW: unit `unit`'s backward on `device` belongs to the previous iteration.
  auto carried = [&schedule, m](int device, int unit) {
    const int count = schedule.carried_backwards[static_cast<std::size_t>(device)];
    return count > 0 && unit >= m - count;
  };
  const auto chunks = static_cast<std::uint64_t>(schedule.chunks);
  auto pass_key = [chunks](PassKind kind, int unit, int chunk) {
    return (static_cast<std::uint64_t>(unit) * chunks + static_cast<std::uint64_t>(chunk)) * 4 +
           static_cast<std::uint64_t>(kind);
  };

  std::vector<OpId> deps, fetch_deps, input;
  std::vector<MemoryEffect> effects;
  std::vector<std::uint8_t> bucket_allocated, bucket_emitted;
  std::vector<std::size_t> pass_offset;  // ZeRO-3: first use of each pass in the rank's sequence
  std::vector<OpId> fetched, released;   // per use: the op its first step waits for; its last
  std::vector<std::optional<OpId>> chain_last;
  std::unordered_map<std::uint64_t, OpId> pass_end;  // last op of each pass of the rank
  for (int r = 0; r < world; ++r) {
    program.begin_rank(r);
    const int device = layout.stage(r);
    const int t = layout.tp_index(r), d = layout.dp_index(r);
    const auto ru = static_cast<std::size_t>(r);
    // Replica d runs what replica 0 runs; with 1D tensor parallelism, tp rank t what rank 0 runs.
    if ((spec.mirror_data_parallel && d > 0) || (mirror_tp && t > 0)) {
      program.set_replica(
          r, layout.rank(mirror_tp ? 0 : t, spec.mirror_data_parallel ? 0 : d, device));
      continue;
    }
    const auto& passes = schedule.passes[static_cast<std::size_t>(device)];
    const std::vector<int> held = schedule.chunks_of(device);
    auto slot_of = [&held](int chunk) {
      return static_cast<std::size_t>(std::find(held.begin(), held.end(), chunk) - held.begin());
    };
    auto chunk_template = [&](int chunk) -> const StageTemplate& { return template_at(chunk, 0); };

    // Model states of every chunk the device holds.
    for (int chunk : held) {
      const StageTemplate& st = chunk_template(chunk);
      const std::int64_t shard = st.shard;
      const bool params_off = zero.stage == 3 && zero.offload_params;
      const std::int64_t params = zero.stage == 3 ? shard : st.plan.parameters;
      const DeviceModelStates on_device =
          device_model_states(zero, dtype, st.plan.parameters, layout.dp);
      program.add_initial_memory(
          r, {MemoryCategory::parameters, MemoryTier::device, on_device.parameters});
      program.add_initial_memory(
          r, {MemoryCategory::gradients, MemoryTier::device, on_device.gradients});
      program.add_initial_memory(
          r, {MemoryCategory::optimizer_states, MemoryTier::device, on_device.optimizer});
      if (schedule.weight_versions > 1) {  // PipeDream-2BW's stashed weight version
        program.add_initial_memory(
            r, {MemoryCategory::parameters, MemoryTier::device,
                on_device.parameters * static_cast<std::int64_t>(schedule.weight_versions - 1)});
      }
      const int carried_units = schedule.carried_backwards[static_cast<std::size_t>(device)];
      if (carried_units > 0) {  // activations of the backwards carried from the last iteration
        program.add_initial_memory(r, {MemoryCategory::activations, MemoryTier::device,
                                       st.stash * static_cast<std::int64_t>(carried_units)});
      }
      if (params_off) {
        program.add_initial_memory(
            r, {MemoryCategory::parameters, offload_tier, Bytes(params * state.parameters)});
      }
      if (st.residual.count() > 0) {  // top-k's error feedback
        program.add_initial_memory(r, {MemoryCategory::gradients, MemoryTier::device, st.residual});
      }
      if (offload_optimizer) {
        // fp32 gradients on the host, where the reduced buckets accumulate for the step.
        program.add_initial_memory(r,
                                   {MemoryCategory::gradients, MemoryTier::host, Bytes(shard * 4)});
        program.add_initial_memory(
            r, {MemoryCategory::optimizer_states, offload_tier, Bytes(shard * state.optimizer)});
      }
    }

    // Per chunk held: the last pass completing its gradients, the op of that pass completing
    // each gradient unit, and the pass's last op.
    std::vector<std::size_t> last_grad_pass(held.size(), 0);
    for (std::size_t p = 0; p < passes.size(); ++p) {
      if (passes[p].kind == template_of(passes[p]).grad_kind) {
        last_grad_pass[slot_of(passes[p].chunk)] = p;
      }
    }
    std::vector<std::vector<OpId>> unit_done(held.size());
    for (std::size_t k = 0; k < held.size(); ++k) {
      unit_done[k].assign(chunk_template(held[k]).plan.grad_units.size(), 0);
    }
    std::vector<OpId> last_backward(held.size(), 0);
    std::optional<OpId> last_dp_comm, last_copy;
    pass_end.clear();

    // Compressed gradient synchronisation: steps [begin, end) of a bucket's, the first waiting
    // for `dep`; returns the last op. sync_head: per chunk held and bucket, the last op of its
    // head steps once issued.
    std::vector<std::vector<OpId>> sync_head(held.size());
    for (std::size_t k = 0; k < held.size(); ++k) {
      sync_head[k].assign(chunk_template(held[k]).dp_sync.size(), kNoOp);
    }
    auto sync_suffix = [&](std::size_t bucket, int chunk) {
      return " bucket " + std::to_string(bucket) +
             (held.size() > 1 ? " chunk " + std::to_string(chunk) : "");
    };
    auto emit_sync = [&](const StageTemplate::DpSync& b, std::size_t begin, std::size_t end,
                         OpId dep, const std::string& suffix) {
      OpId last = dep;
      for (std::size_t i = begin; i < end; ++i) {
        const SyncStep& step = b.sync.steps[i];
        const std::string label = "dp grad " + step.what + suffix;
        OpInfo info{
            step.compute ? Stream::compute : Stream::dp_comm, Phase::other, -1, -1, -1, label};
        const MemoryEffect buffer{step.buffer_delta, MemoryCategory::comm_buffers,
                                  MemoryTier::device, step.buffer_delta.count() < 0};
        const std::array<OpId, 1> after = {last};
        const Work work =
            step.compute ? Work(Compute{b.kernels[i]})
                         : Work(Collective{step.collective, step.dtype, dp_group[ru], step.bytes});
        last = program.add(
            work, info, after,
            std::span<const MemoryEffect>(&buffer, step.buffer_delta.count() != 0 ? 1 : 0));
        if (!step.compute) last_dp_comm = last;
      }
      return last;
    };

    // ZeRO-3: the rank's uses of parameters, pass after pass, each fetched in order `ahead`
    // uses early: the fetch of use j waits for the release of use j - ahead - 1.
    pass_offset.assign(passes.size() + 1, 0);
    for (std::size_t p = 0; p < passes.size(); ++p) {
      pass_offset[p + 1] = pass_offset[p] + range_of(passes[p]).uses->size();
    }
    const std::size_t total_uses = pass_offset.back();
    fetched.assign(total_uses, kNoOp);
    released.assign(total_uses, kNoOp);
    std::size_t next_fetch = 0;
    auto emit_fetch = [&] {
      const std::size_t j = next_fetch++;
      const auto p = static_cast<std::size_t>(
          std::upper_bound(pass_offset.begin(), pass_offset.end(), j) - pass_offset.begin() - 1);
      const Pass pass = passes[p];
      const StageTemplate& st = template_of(pass);
      const bool forward = pass.kind == PassKind::forward || pass.kind == PassKind::recompute;
      const Use& use = (*range_of(pass).uses)[j - pass_offset[p]];
      const auto u = static_cast<std::size_t>(use.unit);
      const std::int64_t params = st.plan.grad_units[u].parameters;
      const Bytes full(params * e), shard(shard_of(params) * e);
      const std::int16_t layer = st.unit_layer[u];
      OpInfo info{Stream::copy,
                  forward ? Phase::forward : Phase::backward,
                  pass.microbatch / slices,
                  layer,
                  static_cast<std::int16_t>(layer < 0 ? -1 : layer + 1),
                  {}};
      fetch_deps.clear();
      if (j > ahead && released[j - ahead - 1] != kNoOp) {
        fetch_deps.push_back(released[j - ahead - 1]);
      }
      OpId ready = 0;
      if (zero.offload_params) {
        info.label_id = st.fetch_label[u];
        const MemoryEffect alloc{dp > 1 ? shard : full, MemoryCategory::parameters,
                                 MemoryTier::device, false};
        ready = program.add(Compute{st.fetch_kernels[u]}, info, fetch_deps,
                            std::span<const MemoryEffect>(&alloc, 1));
        last_copy = ready;
        fetch_deps.assign(1, ready);
      }
      if (dp > 1) {
        info.stream = Stream::dp_comm;
        info.label_id = st.gather_label[u];
        const std::array<MemoryEffect, 2> fx = {
            MemoryEffect{full, MemoryCategory::parameters, MemoryTier::device, false},
            MemoryEffect{-shard, MemoryCategory::parameters, MemoryTier::device, true}};
        ready = program.add(Collective{CollectiveKind::all_gather, dtype, dp_group[ru], full}, info,
                            fetch_deps,
                            std::span<const MemoryEffect>(fx.data(), zero.offload_params ? 2 : 1));
        last_dp_comm = ready;
      }
      fetched[j] = ready;
    };
    auto try_prefetch = [&] {
      while (next_fetch < total_uses &&
             (next_fetch <= ahead || released[next_fetch - ahead - 1] != kNoOp)) {
        emit_fetch();
      }
    };
    // A reduce bucket: reduce-scattered over the data-parallel group and, with optimizer
    // offload, its shard copied to the host; a transient bucket is released after both.
    auto emit_bucket = [&](const Bucket& b, OpId dep, int microbatch, bool transient) {
      const MemoryEffect release{Bytes(-b.parameters * e), MemoryCategory::comm_buffers,
                                 MemoryTier::device, true};
      OpId last = dep;
      if (dp > 1) {
        OpInfo info{Stream::dp_comm, Phase::other, microbatch, -1, -1, {}};
        info.label_id = b.reduce_label;
        const std::array<OpId, 1> dep1 = {last};
        const bool frees = transient && !offload_optimizer;
        last = program.add(Collective{CollectiveKind::reduce_scatter, dtype, dp_group[ru],
                                      Bytes(b.parameters * e)},
                           info, dep1, std::span<const MemoryEffect>(&release, frees ? 1 : 0));
        last_dp_comm = last;
      }
      if (offload_optimizer) {
        OpInfo info{Stream::copy, Phase::other, microbatch, -1, -1, {}};
        info.label_id = b.copy_label;
        const std::array<OpId, 1> dep1 = {last};
        last = program.add(Compute{b.copy_kernels}, info, dep1,
                           std::span<const MemoryEffect>(&release, transient ? 1 : 0));
        last_copy = last;
      }
    };
    if (fetching) try_prefetch();

    for (std::size_t p = 0; p < passes.size(); ++p) {
      const Pass pass = passes[p];
      const StageTemplate& st = template_of(pass);
      const std::size_t slot = slot_of(pass.chunk);
      const int unit = pass.microbatch;
      const int microbatch = unit / slices;
      const bool forward = pass.kind == PassKind::forward;
      const bool grad_pass = pass.kind == st.grad_kind;
      const bool final_grad_pass = grad_pass && p == last_grad_pass[slot];
      const Phase phase = forward                            ? Phase::forward
                          : pass.kind == PassKind::recompute ? Phase::recompute
                                                             : Phase::backward;
      const Range range = range_of(pass);
      if (pass.kind == PassKind::weight && range.begin == range.end) continue;
      if (pass.kind == PassKind::recompute && range.begin == range.end) continue;
      const auto& uses = *range.uses;
      const std::size_t offset = pass_offset[p];
      // Where the input comes from and where the output goes: the neighbouring chunks of the
      // chain (forward: previous, backward: next), on another device or on this one.
      const int from_chunk = forward ? schedule.prev_chunk[static_cast<std::size_t>(pass.chunk)]
                             : pass.kind == PassKind::backward
                                 ? schedule.next_chunk[static_cast<std::size_t>(pass.chunk)]
                                 : -1;
      const int to_chunk = forward ? schedule.next_chunk[static_cast<std::size_t>(pass.chunk)]
                           : pass.kind == PassKind::backward
                               ? schedule.prev_chunk[static_cast<std::size_t>(pass.chunk)]
                               : -1;
      const int from_device =
          from_chunk < 0 ? -1 : schedule.device_of_chunk[static_cast<std::size_t>(from_chunk)];
      const int to_device =
          to_chunk < 0 ? -1 : schedule.device_of_chunk[static_cast<std::size_t>(to_chunk)];
      // Stages 2 and 3: this gradient pass's buckets, allocated and reduced so far.
      bucket_allocated.assign(per_microbatch && grad_pass ? st.buckets.size() : 0, 0);
      bucket_emitted.assign(bucket_allocated.size(), 0);
      std::optional<OpId> previous, earlier;  // the last two ops of this pass
      input.clear();
      if (from_device >= 0 && from_device != device) {
        // PipeDream-2BW: a carried backward's gradient came in the previous iteration unless the
        // sender's backward is carried too.
        const bool received_before =
            pass.kind == PassKind::backward && carried(device, unit) && !carried(from_device, unit);
        if (!received_before) {
          OpInfo info{Stream::pp_recv, phase, microbatch, -1, -1, {}};
          info.label_id = forward ? st.recv_activation : st.recv_gradient;
          // An activation is the previous chunk's output; a gradient, that of this chunk's.
          const Bytes bytes = forward ? output_bytes(from_chunk, unit) : st.plan.boundary_bytes;
          input.push_back(program.add(Recv{layout.rank(t, d, from_device), bytes}, info));
        }
      } else if (from_device == device) {  // the neighbouring chunk on this device
        const auto it = pass_end.find(pass_key(pass.kind, unit, from_chunk));
        if (it != pass_end.end()) input.push_back(it->second);
      }
      if (pass.kind == PassKind::backward && separate_recompute) {
        const auto it = pass_end.find(pass_key(PassKind::recompute, unit, pass.chunk));
        if (it != pass_end.end()) input.push_back(it->second);
      }
      if (pass.kind == PassKind::weight) {
        const auto it = pass_end.find(pass_key(PassKind::backward, unit, pass.chunk));
        if (it != pass_end.end()) input.push_back(it->second);
      }
      chain_last.clear();
      const auto& steps = *range.steps;
      for (std::size_t i = range.begin; i < range.end; ++i) {
        const auto& step = steps[i];
        const int index = static_cast<int>(i - range.begin);
        const auto chain = static_cast<std::size_t>(step.chain);
        if (chain_last.size() <= chain) chain_last.resize(chain + 1);
        OpInfo info{step.compute ? Stream::compute : Stream::tp_comm,
                    step.recompute ? Phase::recompute : phase,
                    microbatch,
                    step.layer_begin,
                    step.layer_end,
                    {}};
        info.label_id = step.label;
        deps.clear();
        if (chain_last[chain]) {
          deps.push_back(*chain_last[chain]);
        } else {
          deps.insert(deps.end(), input.begin(), input.end());
        }
        effects.clear();
        const Bytes device_activations = step.activation_delta + step.checkpoint_delta;
        if (device_activations.count() != 0) {
          effects.push_back(
              {device_activations, MemoryCategory::activations, MemoryTier::device, true});
        }
        if (offload_activations && step.checkpoint_fetch.count() > 0) {
          // The checkpoint comes back from the host before the group's recompute.
          const std::array<MemoryEffect, 2> in = {
              MemoryEffect{step.checkpoint_fetch, MemoryCategory::activations, MemoryTier::device,
                           false},
              MemoryEffect{-step.checkpoint_fetch, MemoryCategory::activations, MemoryTier::host,
                           true}};
          OpInfo copy{Stream::copy,     Phase::recompute, microbatch,
                      step.layer_begin, step.layer_end,   {}};
          copy.label_id = checkpoint_in_label;
          // Just in time: the copy may start once the op before the previous one has ended,
          // which leaves one op to hide it behind (without a dependency the in-order copy stream
          // would bring the checkpoint straight back after sending it).
          std::array<OpId, 1> when = {earlier.value_or(0)};
          deps.push_back(
              program.add(Compute{step.checkpoint_in}, copy,
                          earlier ? std::span<const OpId>(when) : std::span<const OpId>(), in));
        }
        for (std::size_t k = 0; k < uses.size(); ++k) {
          if (uses[k].first == index) {
            while (next_fetch <= offset + k) emit_fetch();
            deps.push_back(fetched[offset + k]);
          }
          if (uses[k].last == index) {
            const auto u = static_cast<std::size_t>(uses[k].unit);
            effects.push_back({Bytes(-st.plan.grad_units[u].parameters * e),
                               MemoryCategory::parameters, MemoryTier::device, true});
          }
        }
        const bool reduces = per_microbatch && grad_pass && step.compute;
        if (reduces) {  // a bucket's gradients start to exist with its first unit's
          for (int u : *step.grads_done) {
            const Bucket& b = st.buckets[static_cast<std::size_t>(
                st.bucket_of_unit[static_cast<std::size_t>(u)])];
            if (b.first_unit == u) {
              effects.push_back({Bytes(b.parameters * e), MemoryCategory::comm_buffers,
                                 MemoryTier::device, true});
              bucket_allocated[static_cast<std::size_t>(&b - st.buckets.data())] = 1;
            }
          }
        }
        Work work =
            step.compute
                ? Work(Compute{step.kernels})
                : Work(Collective{step.kind, dtype, tp_group_on(step.axis, ru), step.bytes});
        const OpId op = program.add(work, info, deps, effects);
        earlier = previous;
        previous = op;
        chain_last[chain] = op;
        if (offload_activations && step.checkpoint_delta.count() > 0) {
          // The checkpoint leaves for the host once stored; the device frees it after the copy.
          const std::array<MemoryEffect, 2> out = {
              MemoryEffect{step.checkpoint_delta, MemoryCategory::activations, MemoryTier::host,
                           false},
              MemoryEffect{-step.checkpoint_delta, MemoryCategory::activations, MemoryTier::device,
                           true}};
          OpInfo copy{Stream::copy, phase, microbatch, step.layer_begin, step.layer_end, {}};
          copy.label_id = checkpoint_out_label;
          const std::array<OpId, 1> after = {op};
          program.add(Compute{step.checkpoint_out}, copy, after, out);
        }
        if (fetching) {
          for (std::size_t k = 0; k < uses.size(); ++k) {
            if (uses[k].last == index) released[offset + k] = op;
          }
          try_prefetch();
        }
        if (final_grad_pass && step.compute) {
          for (int u : *step.grads_done) unit_done[slot][static_cast<std::size_t>(u)] = op;
        }
        if (compress_dp && spec.dp_overlap && final_grad_pass && step.compute) {
          // A bucket complete: compress it and start its first collective right away.
          for (int u : *step.grads_done) {
            const auto b =
                static_cast<std::size_t>(st.dp_sync_of_unit[static_cast<std::size_t>(u)]);
            const StageTemplate::DpSync& sync = st.dp_sync[b];
            if (sync.last_unit != u || sync_head[slot][b] != kNoOp) continue;
            sync_head[slot][b] = emit_sync(sync, 0, sync.head, op, sync_suffix(b, pass.chunk));
          }
        }
        if (reduces && spec.dp_overlap) {
          for (int u : *step.grads_done) {
            const Bucket& b = st.buckets[static_cast<std::size_t>(
                st.bucket_of_unit[static_cast<std::size_t>(u)])];
            const auto index_b = static_cast<std::size_t>(&b - st.buckets.data());
            if (b.last_unit == u && bucket_allocated[index_b]) {
              emit_bucket(b, op, microbatch, true);
              bucket_emitted[index_b] = 1;
            }
          }
        }
      }
      if (!previous) {  // a pass without segments passes its input on
        if (input.empty()) continue;
        OpInfo info{Stream::compute, phase, microbatch, -1, -1, {}};
        info.label_id = recv_input_label;
        previous = program.add(Compute{no_kernels}, info, input);
        chain_last.assign(1, previous);
      }
      pass_end[pass_key(pass.kind, unit, pass.chunk)] = *previous;
      if (grad_pass) {
        last_backward[slot] = *previous;
        // Buckets not reduced yet (no overlap, or units no step completes) go after the pass.
        for (std::size_t b = 0; b < bucket_emitted.size(); ++b) {
          if (!bucket_emitted[b]) {
            emit_bucket(st.buckets[b], *previous, microbatch, bucket_allocated[b] != 0);
          }
        }
      }
      if (to_device >= 0 && to_device != device) {
        const bool received_later =
            pass.kind == PassKind::backward && carried(to_device, unit) && !carried(device, unit);
        if (!received_later) {
          OpInfo info{Stream::pp_send, phase, microbatch, -1, -1, {}};
          info.label_id = forward ? st.send_activation : st.send_gradient;
          deps.clear();
          for (const auto& last : chain_last) {
            if (last) deps.push_back(*last);
          }
          const Bytes bytes = forward ? st.plan.boundary_bytes : output_bytes(to_chunk, unit);
          program.add(Send{layout.rank(t, d, to_device), bytes}, info, deps);
        }
      }
    }

    // Gradient synchronisation of each chunk held, in the order their gradients complete.
    std::vector<std::size_t> order(held.size());
    for (std::size_t k = 0; k < held.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return last_grad_pass[a] < last_grad_pass[b]; });
    for (std::size_t slot : order) {
      const int chunk = held[slot];
      const StageTemplate& st = chunk_template(chunk);
      if (compress_dp) {
        // Compressed buckets: what the backward has not issued yet, then the rest in order.
        for (std::size_t b = 0; b < st.dp_sync.size(); ++b) {
          const StageTemplate::DpSync& sync = st.dp_sync[b];
          const std::string suffix = sync_suffix(b, chunk);
          OpId head = sync_head[slot][b];
          if (head == kNoOp) head = emit_sync(sync, 0, sync.head, last_backward[slot], suffix);
          emit_sync(sync, sync.head, sync.sync.steps.size(), head, suffix);
        }
      } else if (zero.stage == 0 && dp_group_size > 1) {
        // Data-parallel gradient all-reduce in buckets, each launched once the last
        // microbatch's backward has produced all of its gradients (DDP / Megatron
        // overlap_grad_reduce).
        const std::int64_t bucket_target = spec.dp_bucket_size.count();
        std::int64_t bucket_params = 0;
        int bucket_index = 0;
        for (std::size_t u = 0; u < st.plan.grad_units.size(); ++u) {
          bucket_params += st.plan.grad_units[u].parameters;
          const bool last_unit = u + 1 == st.plan.grad_units.size();
          if (bucket_params * size_of(dtype) < bucket_target && !last_unit) continue;
          const std::string label = "dp grad all-reduce bucket " + std::to_string(bucket_index++) +
                                    (held.size() > 1 ? " chunk " + std::to_string(chunk) : "");
          OpInfo info{Stream::dp_comm, Phase::other, -1, -1, -1, label};
          std::array<OpId, 1> dep = {spec.dp_overlap ? unit_done[slot][u] : last_backward[slot]};
          last_dp_comm = program.add(Collective{CollectiveKind::all_reduce, dtype, dp_group[ru],
                                                Bytes(bucket_params * size_of(dtype))},
                                     info, dep);
          bucket_params = 0;
        }
      }
      if (zero.stage == 1 && (dp > 1 || offload_optimizer)) {
        // Reduce-scatter (and offload) buckets once the last microbatch has produced them.
        for (const Bucket& b : st.buckets) {
          const OpId dep = spec.dp_overlap ? unit_done[slot][static_cast<std::size_t>(b.last_unit)]
                                           : last_backward[slot];
          emit_bucket(b, dep, -1, false);
        }
      }
      const int part = schedule.part_of_chunk[static_cast<std::size_t>(chunk)];
      if (shared_embedding && (part == 0 || part == schedule.parts - 1)) {
        OpInfo info{Stream::dp_comm, Phase::other, -1, -1, -1, {}};
        info.label_id = embedding_sync_label;
        std::array<OpId, 1> dep = {last_backward[slot]};
        last_dp_comm = program.add(Collective{CollectiveKind::all_reduce, dtype,
                                              embedding_group[ru], spec.embedding_sync_bytes},
                                   info, dep);
      }
    }

    // The optimizer step of each chunk waits for the last gradient synchronisation (the
    // dp-comm and copy streams run in order), on the device or, offloaded, on the host.
    for (std::size_t slot : order) {
      const StageTemplate& st = chunk_template(held[slot]);
      deps.clear();
      if (last_dp_comm) deps.push_back(*last_dp_comm);
      if (offload_optimizer && last_copy) deps.push_back(*last_copy);
      if (deps.empty() && last_backward[slot] != 0) deps.push_back(last_backward[slot]);
      OpInfo info{
          offload_optimizer ? Stream::host : Stream::compute, Phase::optimizer, -1, -1, -1, {}};
      info.label_id = offload_optimizer ? host_optimizer_label : optimizer_label;
      if (offload_optimizer && zero.nvme) {
        OpInfo read = info;
        read.label_id = st.states_in_label;
        program.add(Compute{st.states_in}, read, deps);
        deps.clear();  // the host stream runs in order
      }
      const OpId step = program.add(Compute{st.optimizer_kernels}, info, deps);
      if (offload_optimizer && zero.nvme) {
        OpInfo write = info;
        write.label_id = st.states_out_label;
        program.add(Compute{st.states_out}, write);
      }
      const std::array<OpId, 1> after_step = {step};
      for (std::size_t k = 0; k < st.gather_buckets.size(); ++k) {
        // Stages 1 and 2: the updated parameters (copied back from the host) all-gathered.
        std::array<OpId, 1> dep = after_step;
        if (offload_optimizer) {
          OpInfo copy{Stream::copy, Phase::optimizer, -1, -1, -1, {}};
          copy.label_id = st.gather_bucket_copy_label[k];
          dep[0] = program.add(Compute{st.gather_bucket_copy[k]}, copy, after_step);
        }
        if (dp > 1) {
          OpInfo gather{Stream::dp_comm, Phase::other, -1, -1, -1, {}};
          gather.label_id = st.gather_bucket_label[k];
          program.add(Collective{CollectiveKind::all_gather, dtype, dp_group[ru],
                                 Bytes(st.gather_buckets[k] * e)},
                      gather, dep);
        }
      }
      if (st.params_back_needed) {
        // Stage 3: the updated shard to where the parameters live (the host writes in place).
        OpInfo copy{Stream::copy, Phase::optimizer, -1, -1, -1, {}};
        if (offload_optimizer && zero.offload_params) copy.stream = Stream::host;
        copy.label_id = st.params_back_label;
        program.add(Compute{st.params_back}, copy, after_step);
      }
    }
  }
  program.finish();
  return program;
}

}  // namespace stratasim::strategies
