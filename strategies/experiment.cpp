#include "strategies/experiment.hpp"

#include <algorithm>
#include <sstream>
#include <tuple>

#include "hw_models/sane_bounds.hpp"
#include "strategies/dlrm.hpp"
#include "strategies/foreign_inputs.hpp"
#include "strategies/lowering/pipeline_spec.hpp"
#include "strategies/moe.hpp"
#include "strategies/rnn.hpp"
#include "strategies/schedule.hpp"

namespace stratasim::strategies {

std::string_view name_of(LossScaling s) {
  switch (s) {
    case LossScaling::none:
      return "none";
    case LossScaling::static_:
      return "static";
    case LossScaling::dynamic:
      return "dynamic";
  }
  return "?";
}

std::string_view name_of(RecomputeKind r) {
  switch (r) {
    case RecomputeKind::none:
      return "none";
    case RecomputeKind::full:
      return "full";
    case RecomputeKind::selective:
      return "selective";
    case RecomputeKind::stage_aware:
      return "stage_aware";
  }
  return "?";
}

std::string_view name_of(ScheduleKind s) {
  switch (s) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::pipedream_2bw:
      return "pipedream-2bw";
    case ScheduleKind::merak_scp:
      return "merak-scp";
    case ScheduleKind::zb_h1:
      return "zb-h1";
    case ScheduleKind::zb_h2:
      return "zb-h2";
    case ScheduleKind::zb_v:
      return "zb-v";
    case ScheduleKind::chimera:
      return "chimera";
    case ScheduleKind::terapipe:
      return "terapipe";
    case ScheduleKind::dualpipe:
      return "dualpipe";
  }
  return "?";
}

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_h2 || kind == ScheduleKind::zb_v ||
         kind == ScheduleKind::dualpipe;
}

bool holds_parts_twice(ScheduleKind kind) {
  return kind == ScheduleKind::chimera || kind == ScheduleKind::dualpipe;
}

std::optional<ScheduleKind> schedule_from_name(std::string_view name) {
  for (ScheduleKind k : kAllSchedules) {
    if (name_of(k) == name) return k;
  }
  return std::nullopt;
}

namespace {

// "grad_compression": a name ("none", "fp16", "int8", "topk", "s2-reducer") or an object
// {"kind": ..., "density": 0.01, "sketch_ratio": 1}.
GradCompression read_grad_compression(config::ObjectReader& r) {
  GradCompression c;
  const std::string key = "grad_compression";
  if (!r.has(key)) return c;
  const nlohmann::json* v = r.document().find(r.path_of(key));
  if (v == nullptr || v->is_null()) return c;
  const std::vector<std::string> names = {"none", "fp16", "int8", "topk", "s2-reducer"};
  const std::string expected =
      "expected \"none\", \"fp16\", \"int8\", \"topk\", \"s2-reducer\" or an object such as "
      "{\"kind\": \"topk\", \"density\": 0.01}";
  if (v->is_string()) {
    const auto kind = grad_compression_from_name(v->get<std::string>());
    if (!kind) {
      const std::string hint = config::closest_match(v->get<std::string>(), names);
      r.fail(key, expected + (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
    }
    c.kind = *kind;
    return c;
  }
  if (!v->is_object()) r.fail(key, expected);
  config::ObjectReader o(r.document(), r.path_of(key), "a gradient compression");
  c.kind =
      *grad_compression_from_name(o.choice("kind", {"none", "fp16", "int8", "topk", "s2-reducer"}));
  const bool sparse =
      c.kind == GradCompressionKind::topk || c.kind == GradCompressionKind::s2_reducer;
  if (o.has("density") && !sparse) {
    o.fail("density", "applies to \"topk\" and \"s2-reducer\" only; kind is \"" +
                          std::string(name_of(c.kind)) + "\"");
  }
  if (o.has("sketch_ratio") && c.kind != GradCompressionKind::s2_reducer) {
    o.fail("sketch_ratio",
           "applies to \"s2-reducer\" only; kind is \"" + std::string(name_of(c.kind)) + "\"");
  }
  c.density = o.number_or("density", c.density);
  if (!(c.density > 0.0 && c.density <= 1.0)) {
    o.fail("density", "expected the fraction of gradient elements sent, in (0, 1], got " +
                          std::to_string(c.density));
  }
  c.sketch_ratio = o.number_or("sketch_ratio", c.sketch_ratio);
  if (!(c.sketch_ratio > 0.0 && c.sketch_ratio <= 1e6)) {
    o.fail("sketch_ratio", "expected count-sketch counters per non-zero gradient, > 0, got " +
                               std::to_string(c.sketch_ratio));
  }
  o.finish();
  return c;
}

// "partition": "even", "balanced", or a list of layers per stage (model chunk).
PartitionSpec read_partition(config::ObjectReader& r) {
  PartitionSpec partition;
  if (const nlohmann::json* v =
          r.has("partition") ? r.document().find(r.path_of("partition")) : nullptr) {
    if (v->is_string() && (*v == "even" || *v == "balanced")) {
      partition.kind = *v == "even" ? PartitionKind::even : PartitionKind::balanced;
    } else if (v->is_array() && !v->empty() && std::all_of(v->begin(), v->end(), [](const auto& x) {
                 return x.is_number_integer() && x.template get<std::int64_t>() >= 0 &&
                        x.template get<std::int64_t>() < (1 << 20);
               })) {
      partition.kind = PartitionKind::explicit_;
      for (const auto& x : *v) partition.layers_per_stage.push_back(x.get<int>());
    } else {
      std::string hint =
          v->is_string() ? config::closest_match(v->get<std::string>(), {"even", "balanced"}) : "";
      r.fail("partition",
             "expected \"even\", \"balanced\" or a list of layers per stage such "
             "as [9, 8, 8, 7]" +
                 (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
    }
  }
  return partition;
}

// "offload": one of "none", "optimizer", "params", "nvme", "activations", or a list of them.
OffloadSpec read_offload(config::ObjectReader& r) {
  OffloadSpec offload;
  if (const nlohmann::json* v =
          r.has("offload") ? r.document().find(r.path_of("offload")) : nullptr) {
    std::vector<std::string> items;
    if (v->is_string()) {
      items.push_back(v->get<std::string>());
    } else if (v->is_array() &&
               std::all_of(v->begin(), v->end(), [](const auto& x) { return x.is_string(); })) {
      for (const auto& x : *v) items.push_back(x.get<std::string>());
    } else {
      r.fail("offload",
             "expected \"none\", \"optimizer\", \"params\", \"nvme\", \"activations\" or a list of "
             "them");
    }
    for (const auto& item : items) {
      if (item == "optimizer")
        offload.optimizer = true;
      else if (item == "params")
        offload.params = true;
      else if (item == "nvme")
        offload.nvme = true;
      else if (item == "activations")
        offload.activations = true;
      else if (item != "none") {
        std::string hint =
            config::closest_match(item, {"none", "optimizer", "params", "nvme", "activations"});
        r.fail("offload", "unknown offload \"" + item +
                              "\"; expected none, optimizer, params, nvme or activations" +
                              (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
      }
    }
  }
  return offload;
}

ParallelismSpec read_parallelism(config::ObjectReader r) {
  ParallelismSpec p;
  constexpr std::int64_t kMaxDegree = 1 << 24;
  p.tp = static_cast<int>(r.integer_in_or("tp", 1, kMaxDegree, 1));
  p.pp = static_cast<int>(r.integer_in_or("pp", 1, kMaxDegree, 1));
  p.dp = static_cast<int>(r.integer_in_or("dp", 1, kMaxDegree, 0));
  p.cp = static_cast<int>(r.integer_in_or("cp", 1, kMaxDegree, 1));
  p.cp_mode = *cp_mode_from_name(r.choice_or("cp_mode", {"ring", "ulysses", "allgather"}, "ring"));
  p.tp_mode = *tp_mode_from_name(r.choice_or("tp_mode", {"1d", "2d", "2.5d", "3d"}, "1d"));
  const nlohmann::json* depth =
      r.has("tp_depth") ? r.document().find(r.path_of("tp_depth")) : nullptr;
  if (depth != nullptr && !depth->is_null()) {
    p.tp_depth = static_cast<int>(r.integer_in("tp_depth", 1, 1 << 12));
    if (p.tp_mode != TpMode::two_half_d) {
      r.fail("tp_depth", "is 2.5D's depth d: it applies to tp_mode \"2.5d\" only; tp_mode is \"" +
                             std::string(name_of(p.tp_mode)) + "\"");
    }
  } else if (p.tp_mode == TpMode::two_half_d) {
    r.fail("tp_depth",
           "tp_mode \"2.5d\" needs the depth d of its d x q x q mesh (tp = d * q^2), e.g. "
           "\"tp_depth\": 2");
  }
  p.sequence_parallel = r.boolean_or("sequence_parallel", false);
  const std::string sharding =
      r.choice_or("embedding_sharding", {"table", "row", "column"}, "table");
  p.embedding_sharding = sharding == "row"      ? EmbeddingSharding::row
                         : sharding == "column" ? EmbeddingSharding::column
                                                : EmbeddingSharding::table;
  p.pipeline_scatter_gather = r.boolean_or("pipeline_scatter_gather", true);
  p.pipeline_batched_p2p = r.boolean_or("pipeline_batched_p2p", false);
  const bool overlap_given = r.has("dualpipe_overlap");
  p.dualpipe_overlap = r.boolean_or("dualpipe_overlap", true);
  p.schedule =
      *schedule_from_name(r.choice_or("schedule",
                                      {"gpipe", "1f1b", "interleaved", "pipedream-2bw", "merak-scp",
                                       "zb-h1", "zb-h2", "zb-v", "chimera", "terapipe", "dualpipe"},
                                      "1f1b"));
  if (overlap_given && p.schedule != ScheduleKind::dualpipe) {
    r.fail("dualpipe_overlap", "applies to the dualpipe schedule only, not \"" +
                                   std::string(name_of(p.schedule)) + "\"");
  }
  p.virtual_stages = static_cast<int>(r.integer_in_or("virtual_stages", 1, 1 << 12, 1));
  p.sequence_slices = static_cast<int>(r.integer_in_or("sequence_slices", 1, 1 << 16, 1));
  p.tp_overlap = static_cast<int>(r.integer_in_or("tp_overlap", 1, 64, 1));
  p.tp_comm_overlap = r.boolean_or("tp_comm_overlap", false);
  p.partition = read_partition(r);
  p.micro_batch = static_cast<int>(r.integer_in_or("micro_batch", 1, kMaxDegree, 1));
  p.ep = static_cast<int>(r.integer_in_or("ep", 1, kMaxDegree, 1));
  p.etp = static_cast<int>(r.integer_in_or("etp", 1, kMaxDegree, 1));
  p.moe_allgather_dispatcher =
      r.choice_or("moe_token_dispatcher", {"alltoall", "allgather"}, "alltoall") == "allgather";
  p.moe_shared_expert_overlap = r.boolean_or("moe_shared_expert_overlap", false);
  p.moe_grouped_gemm = r.boolean_or("moe_grouped_gemm", true);
  p.moe_fp8_dispatch = r.boolean_or("moe_fp8_dispatch", false);
  p.dp_bucket_size = r.bytes_or("dp_bucket_size", p.dp_bucket_size);
  if (p.dp_bucket_size.count() <= 0) r.fail("dp_bucket_size", "expected a positive size");
  p.dp_overlap = r.boolean_or("dp_overlap", true);
  p.parameter_server = r.choice_or("data_parallel", {"allreduce", "parameter_server"},
                                   "allreduce") == "parameter_server";
  if (r.has("servers") && !p.parameter_server) {
    r.fail("servers",
           "counts parameter servers: it applies with data_parallel "
           "\"parameter_server\" only");
  }
  p.servers =
      p.parameter_server ? static_cast<int>(r.integer_in_or("servers", 1, kMaxDegree, 1)) : 0;
  if (r.has("slice_parameters") && !p.parameter_server) {
    r.fail("slice_parameters",
           "slices the parameter servers' messages: it applies with data_parallel "
           "\"parameter_server\" only");
  }
  p.slice_parameters = r.integer_in_or("slice_parameters", 0, std::int64_t{1} << 40, 0);
  p.overlap_param_gather = r.boolean_or("overlap_param_gather", false);
  p.grad_compression = read_grad_compression(r);

  p.zero = static_cast<int>(r.integer_in_or("zero", 0, 3, 0));
  p.zero_prefetch_layers = static_cast<int>(r.integer_in_or("zero_prefetch_layers", 0, 1 << 16, 1));
  p.zero_prefetch_bucket_size =
      r.integer_in_or("zero_prefetch_bucket_size", 0, std::int64_t{1} << 50, 0);
  p.zero_max_live_parameters =
      r.integer_in_or("zero_max_live_parameters", 0, std::int64_t{1} << 50, 0);
  p.zero_quantized_weights = r.boolean_or("zero_quantized_weights", false);
  p.zero_hpz_partition_size =
      static_cast<int>(r.integer_in_or("zero_hpz_partition_size", 1, kMaxDegree, 1));
  p.zero_quantized_gradients = r.boolean_or("zero_quantized_gradients", false);
  p.reduce_bucket_size =
      r.integer_in_or("reduce_bucket_size", 1, std::int64_t{1} << 50, p.reduce_bucket_size);
  p.allgather_bucket_size =
      r.integer_in_or("allgather_bucket_size", 1, std::int64_t{1} << 50, p.allgather_bucket_size);

  const std::string recompute =
      r.choice_or("recompute", {"none", "full", "selective", "stage_aware"}, "none");
  for (auto k : {RecomputeKind::none, RecomputeKind::full, RecomputeKind::selective,
                 RecomputeKind::stage_aware}) {
    if (name_of(k) == recompute) p.recompute = k;
  }
  p.recompute_method = r.choice_or("recompute_method", {"uniform", "block"}, "uniform") == "block"
                           ? RecomputeMethod::block
                           : RecomputeMethod::uniform;
  p.recompute_num_layers = static_cast<int>(r.integer_in_or("recompute_num_layers", 0, 1 << 16, 1));

  p.offload = read_offload(r);
  r.finish();
  return p;
}

MemorySettings read_memory(config::ObjectReader r) {
  MemorySettings m;
  m.fragmentation = r.number_or("fragmentation", 1.0);
  if (!(m.fragmentation >= 1.0 && m.fragmentation <= 10.0)) {
    r.fail("fragmentation", "expected a factor from 1 to 10");
  }
  if (r.has("reserved")) m.reserved = r.bytes("reserved");
  m.cuda_context = r.bytes_or("cuda_context", kDefaultCudaContext);
  m.nccl_buffers = r.bytes_or("nccl_buffers", kDefaultNcclBuffers);
  for (const char* key : {"reserved", "cuda_context", "nccl_buffers"}) {
    if (r.has(key) && r.bytes(key).count() < 0) r.fail(key, "must not be negative");
  }
  r.finish();
  return m;
}

// training.fp8 (strategies/precision.hpp), for training.dtype `gemm` ("fp8" or "fp4").
LowPrecisionSpec read_low_precision(config::ObjectReader r, DType gemm) {
  LowPrecisionSpec s;
  s.dtype = gemm;
  s.format = r.choice_or("format", {"hybrid", "e4m3"}, "hybrid") == "e4m3" ? Fp8Format::e4m3
                                                                           : Fp8Format::hybrid;
  s.recipe = *scaling_recipe_from_name(
      r.choice_or("recipe", {"delayed", "current", "block", "mxfp8", "nvfp4"},
                  gemm == DType::fp4 ? "nvfp4" : "delayed"));
  s.amax_history_len = static_cast<int>(r.integer_in_or("amax_history_len", 1, 1 << 20, 1024));
  s.amax_compute_algo = r.choice_or("amax_compute_algo", {"max", "most_recent"}, "max") == "max"
                            ? AmaxAlgo::max
                            : AmaxAlgo::most_recent;
  s.attention = r.boolean_or("attention", false);
  s.bf16_first_layers = static_cast<int>(r.integer_in_or("bf16_first_layers", 0, 1 << 20, 0));
  s.bf16_last_layers = static_cast<int>(r.integer_in_or("bf16_last_layers", 0, 1 << 20, 0));
  s.param_gather = r.boolean_or("param_gather", false);
  s.tp_comm = r.boolean_or("tp_comm", false);
  r.finish();
  return s;
}

// `accumulation`: training.gradient_accumulation_steps (DeepSpeed's), 0 when not given; with
// it, global_batch may be left out and follows from micro_batch x accumulation x dp.
// `sequences`: the model trains on sequences of training.seq_len tokens (a transformer or a
// layer table), which must then be given; a DLRM or RNN model has none (an RNN's timesteps are
// the model's).
TrainingSpec read_training(config::ObjectReader r, std::int64_t& accumulation, bool sequences) {
  TrainingSpec t;
  accumulation = r.integer_in_or("gradient_accumulation_steps", 1, 1 << 24, 0);
  t.global_batch = accumulation > 0 ? r.integer_in_or("global_batch", 1, std::int64_t{1} << 40, 0)
                                    : r.integer_in("global_batch", 1, std::int64_t{1} << 40);
  t.seq_len = static_cast<int>(sequences ? r.integer_in("seq_len", 1, 1 << 24)
                                         : r.integer_in_or("seq_len", 1, 1 << 24, 0));
  t.algorithm = r.choice_or("algorithm", {"bptt", "admm"}, "bptt") == "admm"
                    ? TrainingAlgorithm::admm
                    : TrainingAlgorithm::backprop;
  t.iterations_to_accuracy = r.integer_in_or("iterations_to_accuracy", 1, std::int64_t{1} << 40, 0);
  t.dtype = *dtype_from_name(r.choice_or("dtype", {"bf16", "fp16", "fp32", "fp8", "fp4"}, "bf16"));
  if (t.dtype == DType::fp8 || t.dtype == DType::fp4) {
    // The linear layers' GEMMs in fp8 / fp4, everything else in bf16 (strategies/precision.hpp).
    if (r.has("fp8")) {
      t.low_precision = read_low_precision(r.object("fp8", "FP8 settings"), t.dtype);
    } else {
      t.low_precision = LowPrecisionSpec{};
      t.low_precision->dtype = t.dtype;
      if (t.dtype == DType::fp4) t.low_precision->recipe = ScalingRecipe::nvfp4;
    }
    t.dtype = DType::bf16;
  } else if (r.has("fp8")) {
    r.fail("fp8", "FP8 settings apply with training.dtype \"fp8\" or \"fp4\" (it is \"" +
                      std::string(name_of(t.dtype)) + "\")");
  }
  t.optimizer = *optimizer_from_name(r.choice_or("optimizer",
                                                 {"adam", "adamw", "sgd", "sgd_momentum", "rmsprop",
                                                  "adagrad", "adafactor", "lion", "adam8bit"},
                                                 "adam"));
  t.flash_attention = r.boolean_or("flash_attention", false);
  t.framework = *framework_from_name(
      r.choice_or("framework", {"generic", "megatron", "deepspeed", "fsdp"}, "generic"));
  if (r.has("grad_accumulation_dtype")) {
    const DType g = *dtype_from_name(r.choice("grad_accumulation_dtype", {"fp32", "bf16", "fp16"}));
    if (g != DType::fp32 && g != t.dtype) {
      r.fail("grad_accumulation_dtype", "expected \"fp32\" or the training dtype (\"" +
                                            std::string(name_of(t.dtype)) + "\"), got \"" +
                                            std::string(name_of(g)) + "\"");
    }
    t.grad_accumulation_dtype = g;
  }
  if (r.has("distributed_optimizer")) t.distributed_optimizer = r.boolean("distributed_optimizer");
  if (r.has("compute_efficiency")) {
    t.compute_efficiency = r.number("compute_efficiency");
    if (!is_efficiency(*t.compute_efficiency)) {
      r.fail("compute_efficiency",
             "expected a share of the devices' compute rates: " + efficiency_expected());
    }
  }
  if (r.has("elementwise_traffic")) {
    t.elementwise_traffic = r.number("elementwise_traffic");
    if (!(*t.elementwise_traffic >= 1 && *t.elementwise_traffic <= 100)) {
      r.fail("elementwise_traffic",
             "expected a multiple of the memory-bound kernels' bytes in [1, 100]");
    }
  }
  if (r.has("attention_efficiency")) {
    t.attention_efficiency = r.number("attention_efficiency");
    if (!(*t.attention_efficiency >= 0.1 && *t.attention_efficiency <= 10)) {
      r.fail("attention_efficiency",
             "expected a multiple of the attention kernel class's rate in [0.1, 10]");
    }
  }
  t.attention_kernel = *hw::attention_impl_from_name(
      r.choice_or("attention_kernel",
                  {"flash-attention-2", "flash-attention", "flash-attention-3", "cudnn",
                   "flash-attention-triton"},
                  "flash-attention-2"));
  for (auto [key, value] : {std::pair{"hidden_dropout", &t.hidden_dropout},
                            std::pair{"attention_dropout", &t.attention_dropout}}) {
    if (!r.has(key)) continue;
    *value = r.number(key);
    if (auto problem = dropout_problem(**value)) r.fail(key, *problem);
  }
  t.grad_clip = r.number_or("grad_clip", 0.0);
  if (!(t.grad_clip >= 0.0 && t.grad_clip <= 1e12)) {
    r.fail("grad_clip", "expected a max gradient norm > 0, or 0 for no clipping");
  }
  const std::string scaling = r.choice_or("loss_scaling", {"dynamic", "static", "none"},
                                          t.dtype == DType::fp16 ? "dynamic" : "none");
  t.loss_scaling = scaling == "dynamic"  ? LossScaling::dynamic
                   : scaling == "static" ? LossScaling::static_
                                         : LossScaling::none;
  t.step_overhead = r.time_or("step_overhead", Time::zero());
  if (t.step_overhead > Time::ms(1'000'000)) {
    r.fail("step_overhead", "expected at most 1000 s of host time per iteration");
  }
  t.microbatch_overhead = r.time_or("microbatch_overhead", Time::zero());
  if (t.microbatch_overhead > Time::ms(10'000)) {
    r.fail("microbatch_overhead", "expected at most 10 s of host time per pass");
  }
  if (r.has("fsdp")) t.fsdp = read_fsdp(r.object("fsdp", "PyTorch FSDP's settings"), t.dtype);
  r.finish();
  return t;
}

// The training framework's kernel efficiency, held by every GPU of the cluster (the cost model
// reads it there): the experiment's, else its framework's fitted value.
void apply_framework_efficiency(Experiment& e) {
  const FrameworkDefaults defaults =
      framework_defaults(e.training.framework, e.training.dtype, e.parallelism.zero);
  const double compute = e.training.compute_efficiency.value_or(defaults.compute_efficiency);
  const double traffic = e.training.elementwise_traffic.value_or(defaults.elementwise_traffic);
  const double attention = e.training.attention_efficiency.value_or(defaults.attention_efficiency);
  auto apply = [&](hw::DeviceSpec& d) {
    if (d.is_fpga()) return;  // a dataflow design runs no framework's kernels
    d.efficiency.framework_compute = compute;
    d.efficiency.framework_memory_traffic = traffic;
    d.efficiency.framework_attention = attention;
    const DieTraining die = die_training(d.die);
    d.efficiency.die_gemm = die.gemm;
    d.efficiency.die_attention = die.attention;
  };
  apply(e.cluster.device);
  for (auto& o : e.cluster.overrides) {
    if (o.device) apply(*o.device);
  }
}

std::string number(std::int64_t v) {
  return std::to_string(v);
}

// tp_mode 2d, 2.5d and 3d: the mesh, what the layers' shapes need and what is not modelled
// with them.
void check_tp_mode(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  const auto& m = e.model;
  const std::string mode = "tp_mode " + std::string(name_of(p.tp_mode));
  if (e.layer_table) {
    doc.fail("parallelism.tp_mode",
             "a layer-table model has no tensor-parallel layers to split; use \"1d\" (and tp 1)");
  }
  if (auto problem = tp_mesh_problem(p.tp_mode, p.tp, p.tp_depth)) {
    doc.fail("parallelism.tp", *problem);
  }
  const TpMesh mesh = make_tp_mesh(p.tp_mode, p.tp, p.tp_depth);
  if (p.sequence_parallel) {
    doc.fail("parallelism.tp_mode",
             mode +
                 " already splits every activation over the mesh; sequence parallelism "
                 "(parallelism.sequence_parallel) is modelled with Megatron's \"1d\" only");
  }
  if (p.tp_overlap > 1) {
    doc.fail("parallelism.tp_mode",
             mode +
                 ": Merak's sub-pipelined tensor parallelism "
                 "(parallelism.tp_overlap > 1) is modelled with \"1d\" only");
  }
  if (splits_backward(p.schedule)) {
    doc.fail("parallelism.tp_mode",
             mode + ": the split backward of " + std::string(name_of(p.schedule)) +
                 " would separate the weight-gradient GEMMs from their mesh reductions; it is "
                 "modelled with \"1d\" only");
  }
  if (m.explicit_head_dim > 0 && std::int64_t{m.head_dim()} * m.heads != m.hidden) {
    doc.fail("parallelism.tp_mode", mode +
                                        ": a head width other than hidden / heads (the "
                                        "model's head_dim) is modelled with \"1d\" only");
  }
  for (const auto& [on, key] : {std::pair<bool, const char*>{m.qkv_bias && !m.bias, "qkv_bias"},
                                {m.qk_norm, "qk_norm"},
                                {m.post_norm, "post_norm"}}) {
    if (on) {
      doc.fail("parallelism.tp_mode",
               mode + ": the model's " + key + " is modelled with \"1d\" only");
    }
  }
  const std::int64_t q = mesh.q;
  const std::string qs = " (q = " + number(q) + ")";
  if (m.heads % q != 0 || m.kv_heads % q != 0) {
    doc.fail("parallelism.tp", mode + qs +
                                   " splits the attention heads over q: q must divide "
                                   "heads (" +
                                   number(m.heads) + ") and kv_heads (" + number(m.kv_heads) + ")");
  }
  const std::int64_t qkv = std::int64_t{m.heads + 2 * m.kv_heads} * m.head_dim();
  for (const auto& [what, value] : {std::pair<std::string, std::int64_t>{"hidden", m.hidden},
                                    {"ffn_hidden", m.ffn_hidden},
                                    {"qkv width (heads + 2 kv_heads) * head_dim", qkv}}) {
    if (value % (q * q) != 0) {
      doc.fail("parallelism.tp",
               mode + qs + " splits weights and their biases and norms in q^2 = " + number(q * q) +
                   " pieces: it must divide the model's " + what + " (" + number(value) + ")");
    }
  }
  if (p.micro_batch % mesh.batch_split() != 0) {
    doc.fail("parallelism.micro_batch", mode + qs + " splits each micro-batch's samples over " +
                                            number(mesh.batch_split()) + " ranks" +
                                            (p.tp_mode == TpMode::two_half_d ? " (tp_depth * q)"
                                             : p.tp_mode == TpMode::three_d  ? " (q^2)"
                                                                             : " (q)") +
                                            ": it must divide micro_batch, got " +
                                            number(p.micro_batch));
  }
}

// What changed a model, from the origins of the overrides that did: origins "X (Y)" grouped by
// X, "--megatron-args: --num-layers 48, --hidden-size 6144"; others as they are.
std::string modified_by(const std::vector<std::string>& origins) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& origin : origins) {
    std::string who = origin;
    std::string what;
    const auto open = origin.find(" (");
    if (open != std::string::npos && origin.back() == ')') {
      who = origin.substr(0, open);
      what = origin.substr(open + 2, origin.size() - open - 3);
    }
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == who; });
    if (it == groups.end()) it = groups.insert(groups.end(), {who, {}});
    if (!what.empty() &&
        std::find(it->second.begin(), it->second.end(), what) == it->second.end()) {
      it->second.push_back(what);
    }
  }
  std::string text;
  for (const auto& [who, whats] : groups) {
    text += (text.empty() ? "" : "; ") + who;
    for (std::size_t i = 0; i < whats.size(); ++i) text += (i == 0 ? ": " : ", ") + whats[i];
  }
  return text;
}

// Inline referenced files first so that overrides can reach into them; a Hugging Face
// config.json as the model becomes the equivalent model object. Overrides that change the
// model's keys (--megatron-args' --num-layers, --set model.hidden=...) rename it after what
// changed it, "llama2-7b (modified by --megatron-args: --num-layers 48)", unless one names it.
void inline_and_override(config::Document& doc, const std::vector<Override>& overrides,
                         std::vector<std::string>& notes) {
  doc.inline_reference("model");
  convert_hf_model(doc, "model", notes);
  doc.inline_reference("cluster");
  doc.inline_reference("cluster.device");
  std::vector<std::string> model_changes;  // origins of overrides that changed a model key
  bool named = false;
  for (const auto& o : overrides) {
    if (o.path == "model") {
      model_changes.clear();
      named = false;
    } else if (o.path == "model.name") {
      named = true;
    } else if (o.path.rfind("model.", 0) == 0) {
      const nlohmann::json* before = doc.find(o.path);
      if (before == nullptr || *before != o.value) model_changes.push_back(o.origin);
    }
    doc.set(o.path, o.value, o.origin);
    // An override may itself name a file ("--set cluster=other.json").
    if (o.path == "model" || o.path == "cluster") doc.inline_reference(o.path);
    if (o.path == "model") convert_hf_model(doc, "model", notes);
    if (o.path == "cluster" || o.path == "cluster.device") doc.inline_reference("cluster.device");
  }
  const nlohmann::json* name = doc.find("model.name");
  if (!model_changes.empty() && !named && name != nullptr && name->is_string()) {
    doc.set("model.name",
            name->get<std::string>() + " (modified by " + modified_by(model_changes) + ")",
            modified_by(model_changes));
  }
}

// The model: a layer table (model.type "layers"), a DLRM ("dlrm"), an RNN ("rnn") or a
// transformer's shape.
void read_model_section(config::Document& doc, Experiment& e) {
  const nlohmann::json* type = doc.find("model.type");
  if (type && type->is_string() && *type == "dlrm") {
    e.dlrm = read_dlrm_model(doc, "model");
    e.model.name = e.dlrm->name;
    e.model.source = e.dlrm->source;
    e.model.layers = static_cast<int>(e.dlrm->bottom_mlp.size() + e.dlrm->top_mlp.size());
  } else if (type && type->is_string() && *type == "rnn") {
    e.rnn = read_rnn_model(doc, "model");
    e.model.name = e.rnn->name;
    e.model.source = e.rnn->source;
    e.model.layers = e.rnn->layers;
  } else if (type && type->is_string() && *type == "layers") {
    e.layer_table = read_layer_table(doc, "model");
    e.model.name = e.layer_table->name;
    e.model.source = e.layer_table->source;
    e.model.layers = e.layer_table->layer_count();
  } else {
    e.model = read_model(doc, "model");
  }
}

// The experiment's keys and sections, read in this order: name, description, model, cluster,
// parallelism, training and memory. `accumulation` receives
// training.gradient_accumulation_steps (0 where not given).
Experiment read_sections(config::Document& doc, std::int64_t& accumulation) {
  config::ObjectReader r(doc, "", "an experiment");
  Experiment e;
  e.name = r.string("name");
  e.description = r.string_or("description", "");
  e.file = doc.file_of("");
  r.has("model");
  read_model_section(doc, e);
  r.has("cluster");
  e.cluster = hw::read_cluster(doc, "cluster");
  e.parallelism = read_parallelism(r.object("parallelism", "the parallel strategy"));
  e.training =
      read_training(r.object("training", "the training settings"), accumulation, !e.dlrm && !e.rnn);
  if (r.has("memory")) e.memory = read_memory(r.object("memory", "memory overheads"));
  if (r.has("embedding_cache")) {
    if (!e.dlrm)
      r.fail("embedding_cache", "caches embedding tables: it applies to model.type \"dlrm\"");
    e.embedding_cache = read_embedding_cache(r.object("embedding_cache", "the embedding cache"));
  }
  if (r.has("transport")) {
    e.transport = read_transport(r.object("transport", "the transport policy"));
    doc.validated("transport", [&] { e.transport.validate(); });
  }
  r.finish();
  return e;
}

// training.hidden_dropout / attention_dropout replace the model's.
void apply_training_dropout(Experiment& e, std::vector<std::string>& notes) {
  for (auto [given, model, key] :
       {std::tuple{e.training.hidden_dropout, &e.model.hidden_dropout, "hidden_dropout"},
        std::tuple{e.training.attention_dropout, &e.model.attention_dropout,
                   "attention_dropout"}}) {
    if (!given) continue;
    if (e.layer_table) {
      notes.push_back(e.file.string() + ": training." + std::string(key) +
                      " has no effect on a layer-table model (its layers' times are given)");
    } else {
      *model = *given;
    }
  }
}

// The framework's ZeRO stage where parallelism.zero is not given (FSDP's FULL_SHARD), and
// Megatron's distributed optimizer against it.
void apply_framework_zero(const config::Document& doc, Experiment& e) {
  auto& p = e.parallelism;
  const FrameworkDefaults framework =
      framework_defaults(e.training.framework, e.training.dtype, p.zero);
  const bool zero_given = doc.find("parallelism.zero") != nullptr;
  auto& fsdp = e.training.fsdp;
  if (!fsdp && e.training.framework == Framework::fsdp && (!zero_given || p.zero == 3) &&
      p.pp == 1) {
    fsdp = fsdp_defaults(e.training.dtype);  // PyTorch FSDP's runtime with its defaults
  }
  if (fsdp) {
    if (zero_given && p.zero != fsdp->zero_stage()) {
      doc.fail("parallelism.zero",
               "training.fsdp's sharding_strategy " + std::string(name_of(fsdp->sharding)) +
                   " keeps the model states of ZeRO stage " + std::to_string(fsdp->zero_stage()) +
                   "; leave parallelism.zero out or set it to " +
                   std::to_string(fsdp->zero_stage()));
    }
    p.zero = fsdp->zero_stage();
  } else if (framework.zero_stage && !zero_given) {
    p.zero = *framework.zero_stage;  // FSDP's FULL_SHARD, lowered as ZeRO-3
  }
  if (e.training.distributed_optimizer.value_or(false) && p.zero >= 2) {
    doc.fail("training.distributed_optimizer",
             "Megatron's distributed optimizer shards the optimizer states (ZeRO stage 1); "
             "parallelism.zero " +
                 std::to_string(p.zero) + " shards more: use one of them");
  }
}

// Megatron's overlap_param_gather: the distributed optimizer's (ZeRO stage 1's) post-step
// all-gathers moved into the next forward; nothing to move without them or with optimizer
// offload (whose copies back to the device come after the step).
void check_overlap_param_gather(const config::Document& doc, const Experiment& e) {
  if (!e.parallelism.overlap_param_gather) return;
  if (effective_zero_stage(e) != 1 || e.training.fsdp) {
    doc.fail("parallelism.overlap_param_gather",
             "overlaps the parameter all-gathers of Megatron's distributed optimizer (ZeRO "
             "stage 1); set training.distributed_optimizer or parallelism.zero 1 (ZeRO stage is " +
                 std::to_string(effective_zero_stage(e)) + ")");
  }
  if (e.parallelism.offload.optimizer) {
    doc.fail("parallelism.overlap_param_gather",
             "is not modelled with optimizer offload (parallelism.offload)");
  }
}

// FP8 / FP4 training against the device and the rest of the experiment (strategies/
// precision.hpp): the device's own FP8 (FP4) rate, 1D tensor parallelism, a transformer, layers
// left to run in low precision, and what the options need.
void check_low_precision(const config::Document& doc, const Experiment& e) {
  if (!e.training.low_precision) return;
  const LowPrecisionSpec& lp = *e.training.low_precision;
  if (auto problem = low_precision_problem(lp, e.cluster.device))
    doc.fail("training.dtype", *problem);
  for (const auto& o : e.cluster.overrides) {
    if (!o.device) continue;
    if (auto problem = low_precision_problem(lp, *o.device)) doc.fail("training.dtype", *problem);
  }
  if (e.layer_table) {
    doc.fail("training.dtype",
             "FP8 / FP4 training is modelled for transformer models (a "
             "layer-table model's layers have no linear layers to quantise)");
  }
  if (e.parallelism.tp_mode != TpMode::one_d) {
    doc.fail("training.dtype",
             "FP8 / FP4 training is modelled with 1D tensor parallelism (parallelism.tp_mode "
             "\"1d\")");
  }
  if (lp.bf16_first_layers + lp.bf16_last_layers >= e.model.layers) {
    doc.fail("training.fp8.bf16_first_layers",
             "expected fewer layers kept in bf16 (first + last) than the model's " +
                 std::to_string(e.model.layers));
  }
  if (lp.tp_comm && !(e.parallelism.sequence_parallel && e.parallelism.tp > 1)) {
    doc.fail("training.fp8.tp_comm",
             "FP8 tensor-parallel communication gathers the sequence-parallel inputs: set "
             "parallelism.sequence_parallel with tp > 1");
  }
  if (lp.param_gather && effective_zero_stage(e) == 0 && !e.training.fsdp) {
    doc.fail("training.fp8.param_gather",
             "FP8 parameter gathering needs sharded weights or optimizer states (Megatron's "
             "distributed optimizer, parallelism.zero >= 1, or FSDP)");
  }
  if (lp.param_gather && e.parallelism.zero_quantized_weights) {
    doc.fail("training.fp8.param_gather",
             "gathers the weights in FP8; ZeRO++'s quantised weights "
             "(parallelism.zero_quantized_weights) gather them in int8: use one of them");
  }
  if (lp.attention && !e.training.flash_attention) {
    doc.fail("training.fp8.attention",
             "FP8 attention is a fused kernel's (Transformer Engine's FP8 dot-product attention): "
             "set training.flash_attention");
  }
}

// PyTorch FSDP's runtime against the rest of the experiment: one pipeline stage, no ZeRO
// offload or compressed gradients (FSDP's own CPU offload is not modelled), Megatron's
// distributed optimizer off, and HYBRID_SHARD's shard group (a node's data-parallel ranks)
// dividing the data-parallel group.
void check_fsdp(const config::Document& doc, const Experiment& e) {
  if (!e.training.fsdp) return;
  const auto& p = e.parallelism;
  const std::string at =
      doc.find("training.fsdp") != nullptr ? "training.fsdp" : "training.framework";
  if (p.pp > 1) {
    doc.fail(at,
             "PyTorch FSDP's runtime is modelled without pipeline parallelism "
             "(parallelism.pp 1, got " +
                 std::to_string(p.pp) + ")");
  }
  if (p.offload.any()) {
    doc.fail("parallelism.offload",
             "ZeRO offload does not apply to PyTorch FSDP (its CPU offload is not modelled)");
  }
  if (p.grad_compression.enabled()) {
    doc.fail("parallelism.grad_compression",
             "compressed gradients are not modelled with PyTorch FSDP's runtime");
  }
  if (e.training.distributed_optimizer.value_or(false)) {
    doc.fail("training.distributed_optimizer",
             "Megatron's distributed optimizer and PyTorch FSDP are two ways to shard: use one");
  }
  for (auto [on, key] : {std::pair{p.zero_quantized_weights, "zero_quantized_weights"},
                         std::pair{p.zero_hpz_partition_size > 1, "zero_hpz_partition_size"},
                         std::pair{p.zero_quantized_gradients, "zero_quantized_gradients"}}) {
    if (on) {
      doc.fail(std::string("parallelism.") + key,
               "is DeepSpeed's ZeRO++; it is not modelled with PyTorch FSDP's runtime");
    }
  }
  if (e.training.fsdp->sharding == FsdpSharding::hybrid_shard) {
    const int shard = fsdp_shard_group(e);
    if (p.dp % shard != 0) {
      doc.fail(at, "HYBRID_SHARD shards within a node (" + std::to_string(shard) +
                       " data-parallel ranks per node); parallelism.dp (" + std::to_string(p.dp) +
                       ") must be a multiple of it");
    }
  }
}

// What the tensor-parallel split needs of the model: the tp_mode's mesh, nothing to split in
// a layer table, Megatron's 1D split of the heads and ffn_hidden.
void check_tensor_parallel(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  const auto& m = e.model;
  if (p.tp_mode != TpMode::one_d) check_tp_mode(doc, e);
  if (e.layer_table) {
    // A layer table gives whole layers: nothing to split over tensor-parallel ranks.
    if (p.tp != 1) {
      doc.fail("parallelism.tp",
               "must be 1 for a layer-table model (its layers carry no "
               "tensor-parallel split), got " +
                   number(p.tp));
    }
    if (p.recompute != RecomputeKind::none) {
      doc.fail("parallelism.recompute",
               "activation recomputation is modelled for transformers; a layer-table model needs "
               "\"none\"");
    }
    if (p.schedule == ScheduleKind::terapipe) {
      doc.fail("parallelism.schedule",
               "terapipe slices transformer sequences; a layer-table model has no sequence to "
               "slice");
    }
    if (p.zero == 3) {
      doc.fail("parallelism.zero", "ZeRO-3 with a layer-table model is not modelled (use 0 to 2)");
    }
  } else if (p.tp_mode == TpMode::one_d) {
    if (m.heads % p.tp != 0 || m.kv_heads % p.tp != 0) {
      doc.fail("parallelism.tp", "must divide the model's attention heads (heads " +
                                     number(m.heads) + ", kv_heads " + number(m.kv_heads) +
                                     "), got " + number(p.tp));
    }
    if (m.ffn_hidden % p.tp != 0) {
      doc.fail("parallelism.tp", "must divide the model's ffn_hidden (" + number(m.ffn_hidden) +
                                     "), got " + number(p.tp));
    }
  }
}

// pp fits the model's layers and tp * pp * dp is the cluster's device count; dp 0 takes the
// devices tp * pp leave.
void resolve_data_parallel(const config::Document& doc, Experiment& e) {
  auto& p = e.parallelism;
  const auto& m = e.model;
  if (p.pp > m.layers) {
    doc.fail("parallelism.pp",
             "must not exceed the model's layers (" + number(m.layers) + "), got " + number(p.pp));
  }
  // Parameter servers take devices of their own, after the workers'.
  const std::int64_t world = e.cluster.world_size() - p.servers;
  if (world < 1) {
    doc.fail("parallelism.servers", number(p.servers) +
                                        " parameter servers leave no device of "
                                        "cluster " +
                                        e.cluster.name + " (" + number(e.cluster.world_size()) +
                                        " devices) to the workers");
  }
  const std::int64_t model_parallel = std::int64_t{p.tp} * p.cp * p.pp;
  // Without context parallelism the messages name tp and pp only, as they always have.
  const std::string mp = p.cp > 1 ? "tp * cp * pp" : "tp * pp";
  const std::string mp_values =
      number(p.tp) + " * " + (p.cp > 1 ? number(p.cp) + " * " : "") + number(p.pp);
  if (p.dp == 0) {
    if (world % model_parallel != 0) {
      // Named at cp when context parallelism takes part (its newest axis), else at tp or pp.
      doc.fail_among(
          p.cp > 1 ? std::vector<std::string>{"parallelism.cp", "parallelism.tp", "parallelism.pp"}
                   : std::vector<std::string>{"parallelism.tp", "parallelism.pp"},
          p.cp > 1 ? "parallelism.cp" : "parallelism",
          mp + " = " + number(model_parallel) + " does not divide the " + number(world) +
              " devices of cluster " + e.cluster.name + "; set tp, " + (p.cp > 1 ? "cp, " : "") +
              "pp (and dp) so that " + mp + " * dp = " + number(world));
    }
    p.dp = static_cast<int>(world / model_parallel);
  } else if (model_parallel * p.dp != world) {
    doc.fail_among(
        {"parallelism.tp", "parallelism.cp", "parallelism.pp", "parallelism.dp"}, "parallelism.dp",
        mp + " * dp = " + mp_values + " * " + number(p.dp) + " = " + number(model_parallel * p.dp) +
            ", but cluster " + e.cluster.name + " has " + number(world) + " devices" +
            (p.servers > 0 ? " besides its " + number(p.servers) + " parameter servers" : ""));
  }
}

// Context parallelism (strategies/context_parallel.hpp): the sequence splits into cp shards
// (2 cp chunks for the causal ring's load balancing), sequence parallelism splits each shard
// over tp, attention is fused, Ulysses splits the heads over tp * cp, and what is not modelled
// with it.
void check_context_parallel(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  if (p.cp <= 1) return;  // cp_mode is read and has nothing to do
  const auto& m = e.model;
  const std::int64_t seq = e.training.seq_len;
  if (e.layer_table) {
    doc.fail("parallelism.cp", "splits transformer sequences; a layer-table model has none");
  }
  const bool ring_causal = p.cp_mode != CpMode::ulysses && m.causal;
  const std::int64_t chunks = ring_causal ? 2 * std::int64_t{p.cp} : p.cp;
  if (seq % chunks != 0) {
    doc.fail("parallelism.cp",
             "cp " + number(p.cp) + " must split training.seq_len (" + number(seq) + ") into " +
                 (ring_causal ? "2 * cp = " + number(chunks) +
                                    " equal chunks (the causal mask's load balancing: rank r "
                                    "holds chunks r and 2cp - 1 - r)"
                              : number(chunks) + " equal shards"));
  }
  if (p.sequence_parallel && (seq / p.cp) % p.tp != 0) {
    doc.fail("parallelism.cp",
             "with sequence parallelism each rank's seq_len / cp = " + number(seq / p.cp) +
                 " tokens must split over tp " + number(p.tp));
  }
  if (!e.training.flash_attention) {
    doc.fail("training.flash_attention",
             "context parallelism runs fused attention (Transformer Engine's, as Megatron-LM "
             "requires): set it to true with parallelism.cp " +
                 number(p.cp));
  }
  if (p.cp_mode == CpMode::ulysses && p.tp_mode == TpMode::one_d &&
      (m.heads % (std::int64_t{p.tp} * p.cp) != 0 ||
       m.kv_heads % (std::int64_t{p.tp} * p.cp) != 0)) {
    doc.fail("parallelism.cp", "cp_mode \"ulysses\" splits the attention heads over tp * cp = " +
                                   number(std::int64_t{p.tp} * p.cp) +
                                   " ranks: it must divide heads (" + number(m.heads) +
                                   ") and kv_heads (" + number(m.kv_heads) + ")");
  }
  const char* problem = nullptr;
  const char* path = "parallelism.cp";
  if (p.tp_mode != TpMode::one_d) {
    problem = "is modelled with Megatron's 1D tensor parallelism (tp_mode \"1d\") only";
  } else if (p.schedule == ScheduleKind::terapipe) {
    problem = "and TeraPipe's token slices both split sequences: choose one";
  } else if (e.training.fsdp && e.training.fsdp->sharding == FsdpSharding::hybrid_shard) {
    problem = "with FSDP's HYBRID_SHARD is not modelled";
  } else if (p.zero_hpz_partition_size > 1 || p.zero_quantized_gradients) {
    problem = "with ZeRO++'s hpZ or qgZ groups is not modelled";
  }
  if (problem != nullptr) doc.fail(path, "cp " + number(p.cp) + " " + problem);
}

// The global batch and the micro-batch: with gradient_accumulation_steps (`accumulation` > 0)
// DeepSpeed's rule, then dp * micro_batch dividing the global batch.
void resolve_batch(const config::Document& doc, Experiment& e, std::int64_t accumulation) {
  auto& p = e.parallelism;
  if (accumulation > 0) {
    // DeepSpeed's rule: train_batch_size = micro-batch x gradient_accumulation_steps x dp; the
    // one left out follows from the other two.
    const nlohmann::json* micro = doc.find("parallelism.micro_batch");
    auto& global = e.training.global_batch;
    const std::int64_t steps = accumulation * p.dp;
    if (global == 0) {
      global = std::int64_t{p.micro_batch} * steps;
    } else if (micro == nullptr || micro->is_null()) {
      if (global % steps != 0) {
        doc.fail("training.gradient_accumulation_steps",
                 "training.global_batch (" + number(global) +
                     ") must be divisible by gradient_accumulation_steps x dp = " +
                     number(accumulation) + " x " + number(p.dp) + " to give the micro-batch");
      }
      p.micro_batch = static_cast<int>(std::min<std::int64_t>(global / steps, 1 << 24));
    } else if (global != std::int64_t{p.micro_batch} * steps) {
      doc.fail("training.gradient_accumulation_steps",
               "training.global_batch (" + number(global) +
                   ") must equal micro_batch x gradient_accumulation_steps x dp = " +
                   number(p.micro_batch) + " x " + number(accumulation) + " x " + number(p.dp) +
                   " = " + number(std::int64_t{p.micro_batch} * steps));
    }
  }
  const std::int64_t per_step = std::int64_t{p.dp} * p.micro_batch;
  if (e.training.global_batch % per_step != 0) {
    doc.fail("training.global_batch", "must be divisible by dp * micro_batch = " + number(p.dp) +
                                          " * " + number(p.micro_batch) + " = " + number(per_step) +
                                          ", got " + number(e.training.global_batch));
  }
}

// training.seq_len against the model's learned positions and sequence parallelism.
void check_seq_len(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  const auto& m = e.model;
  if (!e.layer_table && m.position_embedding == PositionEmbedding::learned &&
      e.training.seq_len > m.max_seq_len) {
    doc.fail("training.seq_len", "must not exceed the model's max_seq_len (" +
                                     number(m.max_seq_len) + "), got " +
                                     number(e.training.seq_len));
  }
  if (p.sequence_parallel && e.training.seq_len % p.tp != 0) {
    doc.fail("training.seq_len", "must be divisible by tp (" + number(p.tp) +
                                     ") with sequence parallelism, got " +
                                     number(e.training.seq_len));
  }
}

// Memory techniques: recomputation, ZeRO, offload and compressed gradients.
void check_memory_techniques(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  const auto& m = e.model;
  const auto& off = p.offload;
  if (p.recompute_num_layers < 1 && p.recompute == RecomputeKind::full) {
    doc.fail("parallelism.recompute_num_layers", "expected at least 1 with full recomputation");
  }
  if (p.recompute == RecomputeKind::full) {
    const int stage_layers = (m.layers + p.pp - 1) / p.pp;
    if (p.recompute_num_layers > stage_layers) {
      doc.fail("parallelism.recompute_num_layers",
               "must not exceed the layers of a pipeline stage (" + number(stage_layers) +
                   "), got " + number(p.recompute_num_layers));
    }
  }
  // ZeRO, offload, compressed gradients and the schedule: the rules of the lowering
  // (strategies/lowering/pipeline_spec.hpp), reported at their JSON paths.
  for (const SpecProblem& problem :
       technique_problems(zero_settings(e), p.grad_compression, p.schedule, p.dp)) {
    doc.fail(problem.path, problem.message);
  }
  if ((off.optimizer || off.params || off.activations) && !e.cluster.host) {
    doc.fail("parallelism.offload", "offloading needs host memory: cluster " + e.cluster.name +
                                        " has no \"host\" section (memory, cores, pcie)");
  }
  if (off.nvme && !e.cluster.nvme) {
    doc.fail("parallelism.offload", "offloading to NVMe needs cluster." + std::string("nvme") +
                                        " (capacity, bandwidth); cluster " + e.cluster.name +
                                        " has none");
  }
  if (off.activations && p.recompute == RecomputeKind::none) {
    doc.fail("parallelism.offload",
             "\"activations\" offloads activation checkpoints: it needs "
             "parallelism.recompute full, selective or stage_aware");
  }
}

// The pipeline schedule: the microbatch count, the options that belong to one schedule
// (virtual_stages, sequence_slices) and the schedule's own constraint.
void check_schedule(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  if (e.microbatches() > (1 << 24)) {
    doc.fail("training.global_batch", "gives more than 16,777,216 microbatches per pipeline");
  }
  if (p.virtual_stages > 1 && p.schedule != ScheduleKind::interleaved) {
    doc.fail("parallelism.virtual_stages",
             "applies to the interleaved schedule only; "
             "parallelism.schedule is \"" +
                 std::string(name_of(p.schedule)) + "\"");
  }
  if (p.sequence_slices > 1 && p.schedule != ScheduleKind::terapipe) {
    doc.fail("parallelism.sequence_slices",
             "applies to the terapipe schedule only; "
             "parallelism.schedule is \"" +
                 std::string(name_of(p.schedule)) + "\"");
  }
  if (e.training.seq_len % p.sequence_slices != 0 ||
      (p.sequence_parallel && (e.training.seq_len / p.sequence_slices) % p.tp != 0)) {
    doc.fail("parallelism.sequence_slices",
             "must divide training.seq_len (" + number(e.training.seq_len) + ")" +
                 (p.sequence_parallel ? " into slices divisible by tp" : "") + ", got " +
                 number(p.sequence_slices));
  }
  if (p.pipeline_batched_p2p && (p.schedule != ScheduleKind::interleaved || p.pp <= 2)) {
    // Megatron-LM asserts pp > 2 for the interleaved schedule without p2p overlap.
    doc.fail("parallelism.pipeline_batched_p2p",
             "applies to the interleaved schedule with pp > 2 (Megatron-LM's condition), got "
             "schedule \"" +
                 std::string(name_of(p.schedule)) + "\" and pp " + number(p.pp));
  }
  const ScheduleOptions options{p.virtual_stages, p.sequence_slices, false, p.dualpipe_overlap};
  if (auto problem =
          schedule_constraint(p.schedule, p.pp, static_cast<int>(e.microbatches()), options)) {
    doc.fail("parallelism.schedule", *problem +
                                         " (microbatches = global_batch / (dp * "
                                         "micro_batch) = " +
                                         number(e.microbatches()) + ")");
  }
}

// How the layers are split: the schedule's parts (stages, or model chunks) against the model's
// layers and an explicit parallelism.partition.
void check_partition(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  const auto& m = e.model;
  const int parts = schedule_parts(
      p.schedule, p.pp,
      ScheduleOptions{p.virtual_stages, p.sequence_slices, false, p.dualpipe_overlap});
  if (parts > m.layers) {
    doc.fail(p.virtual_stages > 1 ? "parallelism.virtual_stages" : "parallelism.pp",
             std::string(name_of(p.schedule)) + " cuts the model into " + number(parts) +
                 " parts, more than its " + number(m.layers) + " layers");
  }
  if (p.partition.kind == PartitionKind::explicit_) {
    const auto& list = p.partition.layers_per_stage;
    std::int64_t sum = 0;
    for (int n : list) sum += n;
    if (static_cast<int>(list.size()) != parts ||
        std::any_of(list.begin(), list.end(), [](int n) { return n < 1; }) || sum != m.layers) {
      doc.fail("parallelism.partition",
               "expected " + number(parts) + " positive layer counts (one per " +
                   (parts == p.pp ? std::string("pipeline stage") : std::string("model chunk")) +
                   ") summing to the model's " + number(m.layers) + " layers, got " +
                   number(static_cast<std::int64_t>(list.size())) + " entries summing to " +
                   number(sum));
    }
  }
}

// Merak's sub-pipelined tensor parallelism: its sub-batches split the micro-batch.
void check_tp_overlap(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  if (p.tp_overlap > 1 && p.micro_batch % p.tp_overlap != 0) {
    doc.fail("parallelism.tp_overlap", "must divide parallelism.micro_batch (" +
                                           number(p.micro_batch) + "), got " +
                                           number(p.tp_overlap));
  }
  if (p.tp_comm_overlap) {
    const char* problem = nullptr;
    if (p.tp < 2) {
      problem = "overlaps the tensor-parallel collectives with their GEMMs: it needs tp >= 2";
    } else if (!p.sequence_parallel) {
      problem =
          "pipelines the sequence-parallel all-gathers and reduce-scatters with their GEMMs "
          "(Megatron-LM requires --sequence-parallel with --tp-comm-overlap): set "
          "parallelism.sequence_parallel";
    } else if (p.tp_overlap > 1) {
      problem =
          "and Merak's sub-pipelining (parallelism.tp_overlap > 1) both overlap the "
          "tensor-parallel collectives: choose one";
    } else if (e.layer_table) {
      problem = "splits the GEMMs of transformer layers; a layer-table model has none";
    } else if (splits_backward(p.schedule)) {
      problem =
          "is not modelled with the split backward of the zb-* and dualpipe schedules (its "
          "chunked "
          "weight-gradient GEMMs would move to the W pass without their collectives)";
    }
    if (problem != nullptr) doc.fail("parallelism.tp_comm_overlap", problem);
  }
  if (p.tp_overlap > 1 && e.layer_table) {
    doc.fail("parallelism.tp_overlap",
             "sub-pipelines tensor-parallel transformer layers; a "
             "layer-table model has none");
  }
}

// Mixture of experts: the expert-parallel layout (Megatron-Core's: ep * etp ranks carved out
// of a stage's tp * cp * dp ranks) and the techniques the MoE lowering models.
void check_moe(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  const auto& m = e.model;
  const bool moe = !e.layer_table && m.moe;
  if (!moe) {
    const char* key = p.ep > 1                      ? "parallelism.ep"
                      : p.etp > 1                   ? "parallelism.etp"
                      : p.moe_allgather_dispatcher  ? "parallelism.moe_token_dispatcher"
                      : p.moe_shared_expert_overlap ? "parallelism.moe_shared_expert_overlap"
                      : p.moe_fp8_dispatch          ? "parallelism.moe_fp8_dispatch"
                                                    : nullptr;
    if (key != nullptr) {
      doc.fail(key, "applies to a mixture-of-experts model (model.moe), and model " + m.name +
                        " has no experts");
    }
    return;
  }
  if (m.moe->num_experts % p.ep != 0) {
    doc.fail("parallelism.ep", "must divide model.moe.num_experts (" + number(m.moe->num_experts) +
                                   "), got " + number(p.ep));
  }
  if ((std::int64_t{p.tp} * p.cp * p.dp) % (std::int64_t{p.ep} * p.etp) != 0) {
    doc.fail("parallelism.ep", "ep * etp (" + number(p.ep) + " * " + number(p.etp) +
                                   ") must divide tp * cp * dp (" + number(p.tp) + " * " +
                                   number(p.cp) + " * " + number(p.dp) +
                                   "): expert-parallel groups are carved out of a stage's "
                                   "tensor-, context- and data-parallel ranks");
  }
  if (m.moe->ffn_hidden % p.etp != 0 || m.moe->shared_width() % p.tp != 0) {
    doc.fail("parallelism.etp", "must divide model.moe.ffn_hidden (" + number(m.moe->ffn_hidden) +
                                    "), and tp the shared experts' width");
  }
  if (p.tp > 1 && !p.sequence_parallel) {
    doc.fail("parallelism.sequence_parallel",
             "must be true with tp > 1 and a mixture-of-experts model (as Megatron-Core "
             "requires: each tensor-parallel rank dispatches its own tokens)");
  }
  if (p.tp_mode != TpMode::one_d) {
    doc.fail("parallelism.tp_mode", "mixture of experts is modelled with Megatron's \"1d\" only");
  }
  if (p.zero >= 2 || e.training.fsdp) {
    doc.fail(e.training.fsdp ? "training.fsdp" : "parallelism.zero",
             "a mixture-of-experts model is modelled with ZeRO stage 0 or 1 (Megatron's "
             "distributed optimizer), not with stages 2, 3 or FSDP");
  }
  if (p.grad_compression.enabled()) {
    doc.fail("parallelism.grad_compression",
             "compressed gradients are not modelled with a mixture-of-experts model");
  }
  if (p.tp_overlap > 1 || p.tp_comm_overlap) {
    doc.fail(p.tp_overlap > 1 ? "parallelism.tp_overlap" : "parallelism.tp_comm_overlap",
             "is not modelled with a mixture-of-experts model");
  }
  if (p.moe_fp8_dispatch && (!e.training.low_precision || p.moe_allgather_dispatcher)) {
    doc.fail("parallelism.moe_fp8_dispatch",
             p.moe_allgather_dispatcher
                 ? "expected the \"alltoall\" token dispatcher (FP8 dispatch quantises the "
                   "all-to-all's tokens), got \"allgather\""
                 : "expected training.dtype \"fp8\" or \"fp4\" (the experts' GEMMs in low "
                   "precision), got \"" +
                       std::string(name_of(e.training.dtype)) + "\"");
  }
}

// The parameter-server strategy (docs/parameter-server.md) is modelled for plain data
// parallelism: one pipeline stage, no tensor or context parallelism, no ZeRO, FSDP, gradient
// compression, offload or experts. Each refusal names the key to change.
void check_parameter_server(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  if (!p.parameter_server) return;
  const std::string why =
      " with parallelism.data_parallel \"parameter_server\" (the parameter-"
      "server strategy is modelled for plain data parallelism)";
  auto require = [&](bool ok, const std::string& key, const std::string& expected) {
    if (!ok) doc.fail(key, "must be " + expected + why);
  };
  require(!e.dlrm && !e.rnn, "parallelism.data_parallel",
          "\"allreduce\" for DLRM and RNN models (the parameter server takes layer-table and "
          "transformer models)");
  require(p.tp == 1, "parallelism.tp", "1");
  require(p.pp == 1, "parallelism.pp", "1");
  require(p.cp == 1, "parallelism.cp", "1");
  require(p.zero == 0, "parallelism.zero", "0");
  require(!p.grad_compression.enabled(), "parallelism.grad_compression", "off");
  require(!p.offload.any(), "parallelism.offload", "none");
  require(!e.training.fsdp, doc.find("training.fsdp") ? "training.fsdp" : "training.framework",
          "without PyTorch FSDP");
  require(!e.model.moe, "model.moe", "absent (no mixture of experts)");
}

}  // namespace

Experiment read_experiment(config::Document& doc, const std::vector<Override>& overrides) {
  std::vector<std::string> notes;
  inline_and_override(doc, overrides, notes);
  std::int64_t accumulation = 0;
  Experiment e = read_sections(doc, accumulation);
  apply_framework_efficiency(e);
  if (e.dlrm || e.rnn) {
    // Not transformers: their own checks (strategies/dlrm.cpp, strategies/rnn.cpp) after the
    // shared resolution of dp and the batch.
    if (e.training.algorithm == TrainingAlgorithm::admm && !e.rnn) {
      doc.fail("training.algorithm", "\"admm\" (ADMMiRNN) trains RNN models (model.type \"rnn\")");
    }
    check_parameter_server(doc, e);
    resolve_data_parallel(doc, e);
    resolve_batch(doc, e, accumulation);
    if (e.dlrm) {
      check_dlrm_experiment(doc, e, notes);
    } else {
      check_rnn_experiment(doc, e, notes);
    }
    for (const auto& note : notes) report_note(note);
    e.notes = std::move(notes);
    return e;
  }
  if (e.training.algorithm == TrainingAlgorithm::admm) {
    doc.fail("training.algorithm", "\"admm\" (ADMMiRNN) trains RNN models (model.type \"rnn\")");
  }
  apply_training_dropout(e, notes);
  // Cross-checks, each reported at the key a user would change, in this order.
  apply_framework_zero(doc, e);
  check_tensor_parallel(doc, e);
  check_parameter_server(doc, e);
  resolve_data_parallel(doc, e);
  check_context_parallel(doc, e);
  check_fsdp(doc, e);
  check_overlap_param_gather(doc, e);
  check_low_precision(doc, e);
  resolve_batch(doc, e, accumulation);
  check_seq_len(doc, e);
  check_memory_techniques(doc, e);
  check_schedule(doc, e);
  check_partition(doc, e);
  check_tp_overlap(doc, e);
  check_moe(doc, e);
  if (!e.layer_table && e.model.moe && e.model.moe->imbalance != MoeImbalance::uniform) {
    // What the load model costs (strategies/moe.hpp): every MoE layer's grouped GEMM and
    // all-to-all are sized by the most loaded expert-parallel rank.
    const auto& p = e.parallelism;
    const double tokens = static_cast<double>(p.micro_batch) * e.training.seq_len / p.tp;
    const ExpertLoad load = expert_load(*e.model.moe, tokens, p.ep);
    std::ostringstream text;
    text.precision(3);
    text << "model.moe.imbalance: the most loaded of the " << p.ep
         << " expert-parallel ranks takes " << load.imbalance()
         << " times the mean tokens; each MoE layer's experts and all-to-alls run at its pace";
    notes.push_back(text.str());
  }
  for (const auto& note : notes) report_note(note);
  e.notes = std::move(notes);
  return e;
}

Experiment load_experiment(const std::filesystem::path& file,
                           const std::vector<Override>& overrides) {
  auto doc = config::Document::load(file);
  return read_experiment(doc, overrides);
}

ModelStateFormat model_state_format(const Experiment& e) {
  const FrameworkDefaults d =
      framework_defaults(e.training.framework, e.training.dtype, e.parallelism.zero);
  ModelStateFormat f;
  f.dtype = e.training.dtype;
  f.grad_dtype = e.training.grad_accumulation_dtype.value_or(d.grad_dtype);
  f.optimizer = e.training.optimizer;
  f.fp32_grad_copy = d.fp32_grad_copy;
  if (e.training.low_precision) {
    f.low_precision = e.training.low_precision;
    f.quantised_directions = quantised_directions(*e.training.low_precision, e.cluster.device);
  }
  return f;
}

bool distributed_optimizer(const Experiment& e) {
  return e.training.distributed_optimizer.value_or(
      framework_defaults(e.training.framework, e.training.dtype, e.parallelism.zero)
          .distributed_optimizer);
}

int fsdp_shard_group(const Experiment& e) {
  const auto& p = e.parallelism;
  if (!e.training.fsdp || e.training.fsdp->sharding != FsdpSharding::hybrid_shard) return p.dp;
  return std::max(1, std::min(p.dp, e.cluster.devices_per_node / std::max(1, p.tp)));
}

int effective_zero_stage(const Experiment& e) {
  return e.parallelism.zero == 0 && distributed_optimizer(e) ? 1 : e.parallelism.zero;
}

Bytes held_back_estimate(const Experiment& e) {
  if (e.memory.reserved) return *e.memory.reserved;
  const auto& p = e.parallelism;
  const int communicators = (p.tp > 1 ? 1 : 0) + (p.cp > 1 ? 1 : 0) +
                            (std::int64_t{p.dp} * p.cp > 1 ? 1 : 0) + (p.pp > 1 ? 2 : 0);
  return held_back_memory(e.memory.cuda_context, e.memory.nccl_buffers, communicators);
}

}  // namespace stratasim::strategies
