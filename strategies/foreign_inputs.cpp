#include "strategies/foreign_inputs.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "hw_models/json_depth.hpp"
#include "strategies/foreign_reading.hpp"
#include "strategies/launch_line.hpp"

namespace stratasim::strategies {

namespace {

using config::ConfigError;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Shared pieces (shown and closest_mapped with the FSDP reader: strategies/foreign_reading.hpp).

using foreign::closest_mapped;
using foreign::shown;

// Names longer than this get no suggestion: no key is that long, and edit distances to every
// known name would cost time quadratic in the length.
constexpr std::size_t kSuggestLength = 64;

// config::closest_match, for names of a sensible length.
std::string suggestion(std::string_view name, const std::vector<std::string>& known) {
  return name.size() > kSuggestLength ? std::string() : config::closest_match(name, known);
}

std::string quote_text(std::string_view text) {
  std::string out = json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::replace);
  if (out.size() > 62) out = out.substr(0, 58) + "...\"";
  return out;
}

// An integer written as a JSON integer or an integral number (DeepSpeed configs write 5e8).
std::optional<std::int64_t> integral(const json& v) {
  constexpr std::int64_t kLimit = std::int64_t{1} << 52;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(kLimit)) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if (i < -kLimit || i > kLimit) return std::nullopt;
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= static_cast<double>(kLimit)) {
      return static_cast<std::int64_t>(d);
    }
  }
  return std::nullopt;
}

// object[key], or null where it is absent or null.
const json* given(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

bool is_auto(const json& v) {
  return v.is_string() && v.get_ref<const std::string&>() == "auto";
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

json parse_json(std::string_view text, const std::string& source) {
  try {
    return config::parse_json_depth_bounded(text, source);
  } catch (const json::parse_error& e) {
    // A line and column a person can go to.
    const std::size_t offset = std::min<std::size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(offset), '\n');
    const std::size_t line_start =
        offset == 0 ? std::string_view::npos : text.rfind('\n', offset - 1);
    const std::size_t column =
        line_start == std::string_view::npos ? offset + 1 : offset - line_start;
    const std::string what = e.what();
    const auto detail = what.find("syntax error");
    throw ConfigError(source, "",
                      "malformed JSON at line " + std::to_string(line) + ", column " +
                          std::to_string(column) + ": " +
                          (detail == std::string::npos ? what : what.substr(detail)));
  } catch (const json::exception& e) {
    // A number too large for a double ("1e400") is out_of_range, not a parse error.
    throw ConfigError(source, "", std::string("malformed JSON: ") + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed.

class DeepSpeedReader : foreign::Reader {
 public:
  explicit DeepSpeedReader(std::string source) : Reader(std::move(source)) {}

  ForeignInput read(const json& root);

 private:
  // Sections accepted but not modelled that change what a run costs: a note each when present
  // and not disabled (false, null, or an object with "enabled": false).
  void note_unmodelled(const json& root);

  // Unknown keys of the object at `path`: an error when within two edits of a mapped key, a note
  // otherwise. `mapped` keys change the experiment; `ignored` ones are accepted silently.
  void check_keys(const json& object, const std::string& path,
                  const std::vector<std::string>& mapped, const std::vector<std::string>& ignored);

  const json* object(const json& parent, const std::string& key, const std::string& path = "");

  std::int64_t integer(const json& v, const std::string& at, std::int64_t lo, std::int64_t hi);
  void auto_kept(const std::string& key, const std::string& ours) {
    note(key + " is \"auto\" (filled in by the Hugging Face Trainer): the experiment's " + ours +
         " is kept");
  }

  void read_batch(const json& root);

  void read_precision(const json& root);

  // gradient_clipping (the max norm; 0: none) and fp16.loss_scale (0: dynamic, as DeepSpeed's
  // default; a value: that static scale).
  void read_clipping(const json& root);

  // Returns the stage when given.
  std::optional<int> read_zero(const json& z);
  // zero_optimization's stage3_* keys: ZeRO-3's prefetch bucket and live-parameter limit
  // (ZeroSettings), and tuning that stratasim does not model.
  void read_zero3_limits(const json& z);
  // ZeRO++ (ZeroSettings): hierarchical partitioning, quantised weights and gradients; the
  // experiment's rules say that they need stage 3 and a partition size dividing dp. And MiCS,
  // not modelled.
  void read_zero_plus_plus(const json& z);

  void offload(const char* what, const std::string& key) {
    offload_.insert(what);
    if (offload_origin_.empty()) offload_origin_ = key;
  }

  void read_offload(const json& z, const char* key, const char* what);

  void read_activation_checkpointing(const json& root);

  void read_optimizer(const json& root);

  std::set<std::string> offload_;
  bool offload_given_ = false;
  std::string offload_origin_;
};

ForeignInput DeepSpeedReader::read(const json& root) {
  if (!root.is_object())
    fail("", "expected a DeepSpeed config (a JSON object), got " + shown(root));
  // A model's config.json given for the DeepSpeed config (the keys of one, none of
  // DeepSpeed's): it would pass as "unknown keys ignored" and simulate the experiment as is.
  if (is_hf_config(root) ||
      (root.contains("num_attention_heads") &&
       (root.contains("hidden_size") || root.contains("num_hidden_layers")))) {
    fail("",
         "is a model's config.json (model_type, architectures, hidden_size, ...), not a "
         "DeepSpeed config: give it to --model");
  }
  check_keys(root, "",
             {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "zero_optimization", "bf16", "bfloat16", "fp16", "amp", "activation_checkpointing",
              "optimizer", "gradient_clipping"},
             {"steps_per_print",
              "wall_clock_breakdown",
              "scheduler",
              "prescale_gradients",
              "gradient_predivide_factor",
              "sparse_gradients",
              "dump_state",
              "memory_breakdown",
              "tensorboard",
              "wandb",
              "csv_monitor",
              "comet",
              "flops_profiler",
              "comms_logger",
              "checkpoint",
              "zero_allow_untested_optimizer",
              "zero_force_ds_cpu_optimizer",
              "aio",
              "elasticity",
              "autotuning",
              "data_efficiency",
              "curriculum_learning",
              "compression_training",
              "sparse_attention",
              "data_types",
              "communication_data_type",
              "seq_parallel_communication_data_type",
              "pipeline",
              "progressive_layer_drop",
              "eigenvalue",
              "quantize_training",
              "timers",
              "use_node_local_storage",
              "load_universal_checkpoint",
              "disable_allgather",
              "fp32_allreduce",
              "hybrid_engine",
              "weight_quantization",
              "compile",
              "nebula",
              "graph_harvesting",
              "monitor_config"});
  note_unmodelled(root);
  set("training.framework", "deepspeed", "a DeepSpeed config");
  read_batch(root);
  read_precision(root);
  read_clipping(root);
  std::optional<int> stage;
  if (const json* z = object(root, "zero_optimization")) stage = read_zero(*z);
  read_activation_checkpointing(root);
  read_optimizer(root);
  if (offload_given_) {
    json list = json::array();
    for (const char* item : {"optimizer", "params", "nvme", "activations"}) {
      if (offload_.contains(item)) list.push_back(item);
    }
    set("parallelism.offload", list, offload_origin_);
  }
  return std::move(out_);
}

void DeepSpeedReader::check_keys(const json& object, const std::string& path,
                                 const std::vector<std::string>& mapped,
                                 const std::vector<std::string>& ignored) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(mapped.begin(), mapped.end(), key) != mapped.end() ||
        std::find(ignored.begin(), ignored.end(), key) != ignored.end()) {
      continue;
    }
    const std::string at = config::join_path(path, key);
    const std::string typo = closest_mapped(key, mapped);
    if (!typo.empty()) {
      fail(at, "unknown key '" + key + "'; did you mean '" + typo + "'?");
    }
    std::vector<std::string> known = mapped;
    known.insert(known.end(), ignored.begin(), ignored.end());
    const std::string hint = suggestion(key, known);
    note("unknown key '" + at + "' ignored" +
         (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
  }
}

const json* DeepSpeedReader::object(const json& parent, const std::string& key,
                                    const std::string& path) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return nullptr;
  const std::string at = config::join_path(path, key);
  if (!it->is_object()) fail(at, "expected an object, got " + shown(*it));
  return &*it;
}

std::int64_t DeepSpeedReader::integer(const json& v, const std::string& at, std::int64_t lo,
                                      std::int64_t hi) {
  const auto i = integral(v);
  if (!i || *i < lo || *i > hi) {
    fail(at,
         "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
             (at.find("batch") != std::string::npos || at.find("accumulation") != std::string::npos
                  ? " or \"auto\""
                  : "") +
             ", got " + shown(v));
  }
  return *i;
}

void DeepSpeedReader::read_batch(const json& root) {
  constexpr std::int64_t kMaxBatch = std::int64_t{1} << 40;
  const json* tbs = given(root, "train_batch_size");
  const json* micro = given(root, "train_micro_batch_size_per_gpu");
  const json* ga = given(root, "gradient_accumulation_steps");
  const bool ga_given = ga != nullptr && !is_auto(*ga);
  if (ga_given) {
    set("training.gradient_accumulation_steps",
        integer(*ga, "gradient_accumulation_steps", 1, 1 << 24), "gradient_accumulation_steps");
  } else if (ga != nullptr) {
    note(
        "gradient_accumulation_steps is \"auto\": it follows from the experiment's "
        "training.global_batch / (parallelism.micro_batch x dp)");
  }
  if (micro != nullptr && !is_auto(*micro)) {
    set("parallelism.micro_batch", integer(*micro, "train_micro_batch_size_per_gpu", 1, 1 << 24),
        "train_micro_batch_size_per_gpu");
  } else if (micro != nullptr) {
    auto_kept("train_micro_batch_size_per_gpu", "parallelism.micro_batch");
  } else if (ga_given && tbs != nullptr && !is_auto(*tbs)) {
    // DeepSpeed derives the micro-batch from the other two: so does the loader.
    set("parallelism.micro_batch", nullptr, "train_micro_batch_size_per_gpu (derived)");
  }
  if (tbs != nullptr && !is_auto(*tbs)) {
    set("training.global_batch", integer(*tbs, "train_batch_size", 1, kMaxBatch),
        "train_batch_size");
  } else if (ga_given) {
    // train_batch_size = micro x accumulation x dp, once dp is known.
    set("training.global_batch", nullptr, "train_batch_size (derived)");
    if (tbs != nullptr) {
      note(
          "train_batch_size is \"auto\": derived as micro-batch x gradient_accumulation_steps "
          "x dp");
    }
  } else if (tbs != nullptr) {
    auto_kept("train_batch_size", "training.global_batch");
  }
}

void DeepSpeedReader::read_precision(const json& root) {
  std::optional<bool> bf16, fp16;
  auto enabled = [&](const char* section, std::optional<bool>& flag) {
    const json* s = object(root, section);
    if (s == nullptr) return;
    check_keys(*s, section, {"enabled"},
               {"auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads",
                "immediate_grad_update", "check_grad_overflow", "opt_level"});
    auto it = s->find("enabled");
    if (it == s->end() || it->is_null()) return;
    if (is_auto(*it)) {
      auto_kept(std::string(section) + ".enabled", "training.dtype");
      return;
    }
    flag = boolean(*it, std::string(section) + ".enabled");
  };
  enabled("bf16", bf16);
  if (!bf16) enabled("bfloat16", bf16);  // DeepSpeed's older name
  enabled("fp16", fp16);
  std::optional<bool> amp;
  enabled("amp", amp);
  if (bf16.value_or(false) && (fp16.value_or(false) || amp.value_or(false))) {
    fail("fp16.enabled", "contradicts bf16.enabled: enable one of bf16 and fp16");
  }
  if (bf16.value_or(false)) {
    set("training.dtype", "bf16", "bf16.enabled");
  } else if (fp16.value_or(false)) {
    set("training.dtype", "fp16", "fp16.enabled");
  } else if (amp.value_or(false)) {
    set("training.dtype", "fp16", "amp.enabled");
    note("amp (NVIDIA Apex) is modelled as fp16 mixed precision");
  } else if (bf16 || fp16) {
    // A precision section written and disabled: DeepSpeed then trains in fp32.
    set("training.dtype", "fp32", bf16 ? "bf16.enabled" : "fp16.enabled");
    note("neither bf16 nor fp16 is enabled: DeepSpeed trains in fp32 (training.dtype \"fp32\")");
  }
}

void DeepSpeedReader::read_clipping(const json& root) {
  auto it = root.find("gradient_clipping");
  if (it != root.end() && !it->is_null() && !is_auto(*it)) {
    if (!it->is_number() || !(it->get<double>() >= 0.0)) {
      fail("gradient_clipping",
           "expected a max gradient norm >= 0 (0: no clipping), got " + shown(*it));
    }
    set("training.grad_clip", it->get<double>(), "gradient_clipping");
  }
  const json* fp16 = object(root, "fp16");
  if (fp16 == nullptr) return;
  auto scale = fp16->find("loss_scale");
  if (scale == fp16->end() || scale->is_null() || is_auto(*scale)) return;
  if (!scale->is_number() || !(scale->get<double>() >= 0.0)) {
    fail("fp16.loss_scale",
         "expected 0 (dynamic loss scaling) or a positive static scale, got " + shown(*scale));
  }
  set("training.loss_scaling", scale->get<double>() == 0.0 ? "dynamic" : "static",
      "fp16.loss_scale");
}

std::optional<int> DeepSpeedReader::read_zero(const json& z) {
  const std::string at = "zero_optimization";
  check_keys(z, at,
             {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size",
              "allgather_bucket_size", "overlap_comm", "cpu_offload", "stage3_prefetch_bucket_size",
              "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "stage3_param_persistence_threshold", "sub_group_size", "zero_hpz_partition_size",
              "zero_quantized_weights", "zero_quantized_gradients", "mics_shard_size"},
             {"contiguous_gradients",
              "reduce_scatter",
              "allgather_partitions",
              "round_robin_gradients",
              "stage3_gather_16bit_weights_on_model_save",
              "stage3_gather_fp16_weights_on_model_save",
              "gather_16bit_weights_on_model_save",
              "elastic_checkpoint",
              "ignore_unused_parameters",
              "legacy_stage1",
              "load_from_fp32_weights",
              "memory_efficient_linear",
              "use_multi_rank_bucket_allreduce",
              "cpu_offload_params",
              "cpu_offload_use_pin_memory",
              "mics_hierarchical_params_gather",
              "pipeline_loading_checkpoint",
              "override_module_apply",
              "log_trace_cache_warnings",
              "zeropp_loco_param",
              "offload_optimizer_config",
              "offload_param_config"});
  std::optional<int> stage;
  if (const json* s = given(z, "stage")) {
    if (is_auto(*s)) {
      auto_kept(at + ".stage", "parallelism.zero");
    } else {
      const auto value = integral(*s);
      if (!value || *value < 0 || *value > 3) {
        fail(at + ".stage", "expected a ZeRO stage 0, 1, 2 or 3, got " + shown(*s));
      }
      stage = static_cast<int>(*value);
      set("parallelism.zero", *stage, at + ".stage");
    }
  }
  for (const char* key : {"reduce_bucket_size", "allgather_bucket_size"}) {
    const json* v = given(z, key);
    if (v == nullptr) continue;
    if (is_auto(*v)) {
      auto_kept(at + "." + key, std::string("parallelism.") + key);
      continue;
    }
    std::int64_t elements = integer(*v, at + "." + key, 0, std::int64_t{1} << 50);
    if (elements == 0) {
      // DeepSpeed fills a bucket until the next gradient (parameter) would overflow it: with
      // 0 every one goes alone. A bucket of one element is that here (bucket_units: a unit
      // larger than the bucket is a bucket of its own).
      note(at + "." + key + " is 0: every gradient unit is reduced (gathered) alone");
      elements = 1;
    }
    set(std::string("parallelism.") + key, elements, at + "." + key);
  }
  if (const json* v = given(z, "overlap_comm")) {
    if (is_auto(*v)) {
      auto_kept(at + ".overlap_comm", "parallelism.dp_overlap");
    } else {
      set("parallelism.dp_overlap", boolean(*v, at + ".overlap_comm"), at + ".overlap_comm");
    }
  }
  if (const json* v = given(z, "cpu_offload")) {  // before offload_optimizer existed
    if (boolean(*v, at + ".cpu_offload")) offload("optimizer", at + ".cpu_offload");
    offload_given_ = true;
  }
  read_offload(z, "offload_optimizer", "optimizer");
  read_offload(z, "offload_param", "params");
  // ZeRO-3's prefetch bucket and live-parameter limit (ZeroSettings), and tuning that
  // stratasim does not model.
  if (stage.value_or(3) == 3) read_zero3_limits(z);
  read_zero_plus_plus(z);
  return stage;
}

void DeepSpeedReader::read_zero3_limits(const json& z) {
  const std::string at = "zero_optimization";
  for (auto [key, ours] : {std::pair{"stage3_prefetch_bucket_size", "zero_prefetch_bucket_size"},
                           std::pair{"stage3_max_live_parameters", "zero_max_live_parameters"}}) {
    const json* v = given(z, key);
    if (v == nullptr) continue;
    if (is_auto(*v)) {
      auto_kept(at + "." + key, std::string("parallelism.") + ours);
      continue;
    }
    const std::int64_t elements = integer(*v, at + "." + key, 0, std::int64_t{1} << 50);
    if (elements == 0 && std::string_view(key) == "stage3_prefetch_bucket_size") {
      // DeepSpeed prefetches nothing with a bucket of 0: each use gathers its parameters.
      note(at + "." + key + " is 0: no prefetch (parallelism.zero_prefetch_layers 0)");
      set("parallelism.zero_prefetch_layers", 0, at + "." + key);
      continue;
    }
    if (elements == 0) {  // stage3_max_live_parameters 0: DeepSpeed's limit of none held
      fail(at + "." + key, "0 would hold no gathered parameter at all; expected at least 1");
    }
    set(std::string("parallelism.") + ours, elements, at + "." + key);
  }
  for (const char* key :
       {"stage3_max_reuse_distance", "stage3_param_persistence_threshold", "sub_group_size"}) {
    const json* v = given(z, key);
    if (v == nullptr || is_auto(*v)) continue;
    integer(*v, at + "." + key, 0, std::int64_t{1} << 52);
    note(at + "." + key + " is not modelled");
  }
}

void DeepSpeedReader::read_zero_plus_plus(const json& z) {
  const std::string at = "zero_optimization";
  if (const json* v = given(z, "zero_hpz_partition_size")) {
    const std::string key = at + ".zero_hpz_partition_size";
    set("parallelism.zero_hpz_partition_size", integer(*v, key, 1, 1 << 24), key);
  }
  for (const char* key : {"zero_quantized_weights", "zero_quantized_gradients"}) {
    if (const json* v = given(z, key)) {
      set(std::string("parallelism.") + key, boolean(*v, at + "." + key), at + "." + key);
    }
  }
  if (const json* v = given(z, "mics_shard_size")) {
    if (integer(*v, at + ".mics_shard_size", -1, 1 << 24) > 0) {
      note(at + ".mics_shard_size (MiCS) is not modelled");
    }
  }
}

void DeepSpeedReader::read_offload(const json& z, const char* key, const char* what) {
  const std::string at = std::string("zero_optimization.") + key;
  const json* o = object(z, key, "zero_optimization");
  if (o == nullptr) return;
  offload_given_ = true;
  check_keys(*o, at, {"device", "ratio"},
             {"pin_memory", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "fast_init",
              "pipeline_read", "pipeline_write", "pipeline"});
  auto it = o->find("device");
  if (it == o->end() || it->is_null()) return;  // DeepSpeed's default device: none
  if (!it->is_string() || (*it != "cpu" && *it != "nvme" && *it != "none")) {
    fail(at + ".device", "expected \"cpu\", \"nvme\" or \"none\", got " + shown(*it));
  }
  if (*it == "none") return;
  offload(what, at + ".device");
  if (*it == "nvme") offload("nvme", at + ".device");
  auto ratio = o->find("ratio");
  if (ratio != o->end() && !ratio->is_null()) {
    if (!ratio->is_number() || !(ratio->get<double>() >= 0.0 && ratio->get<double>() <= 1.0)) {
      fail(at + ".ratio", "expected a fraction from 0 to 1, got " + shown(*ratio));
    }
    if (ratio->get<double>() < 1.0) {
      note(at + ".ratio " + shown(*ratio) +
           " (partial offload) is not modelled: the whole is offloaded");
    }
  }
}

void DeepSpeedReader::read_activation_checkpointing(const json& root) {
  const std::string at = "activation_checkpointing";
  const json* a = object(root, at);
  if (a == nullptr) return;
  check_keys(*a, at, {"partition_activations", "cpu_checkpointing"},
             {"contiguous_memory_optimization", "number_checkpoints",
              "synchronize_checkpoint_boundary", "profile"});
  // The section configures deepspeed.checkpointing, which checkpoints whole layers.
  set("parallelism.recompute", "full", at);
  note(at +
       ": whole layers are recomputed (parallelism.recompute \"full\"; --recompute "
       "chooses otherwise)");
  auto flag = [&](const char* key) {
    auto it = a->find(key);
    return it != a->end() && !it->is_null() && boolean(*it, at + "." + key);
  };
  if (flag("partition_activations")) {
    note(at +
         ".partition_activations is not modelled: checkpoints are kept whole on every "
         "tensor-parallel rank (parallelism.sequence_parallel shards activations)");
  }
  if (flag("cpu_checkpointing")) {
    offload("activations", at + ".cpu_checkpointing");
    offload_given_ = true;
  }
}

void DeepSpeedReader::read_optimizer(const json& root) {
  const json* o = object(root, "optimizer");
  if (o == nullptr) return;
  check_keys(*o, "optimizer", {"type"}, {"params", "legacy_fusion"});
  auto it = o->find("type");
  if (it == o->end() || it->is_null()) return;
  if (!it->is_string()) fail("optimizer.type", "expected an optimizer name, got " + shown(*it));
  const std::string type = lower(it->get<std::string>());
  // DeepSpeed's names (docs: config-json "optimizer"; torch optimizers need
  // zero_allow_untested_optimizer) to strategies/optimizer.hpp's.
  std::string kind;
  if (type == "adam" || type == "fusedadam" || type == "cpuadam" || type == "deepspeedcpuadam") {
    kind = "adam";
    // DeepSpeed's Adam takes "adam_w_mode" (default true): AdamW; the states are the same.
  } else if (type == "adamw") {
    kind = "adamw";
  } else if (type == "sgd") {
    bool momentum = false;  // torch.optim.SGD's default momentum is 0
    if (const json* params = object(*o, "params", "optimizer")) {
      const auto m = params->find("momentum");
      momentum = m != params->end() && m->is_number() && m->get<double>() > 0;
    }
    kind = momentum ? "sgd_momentum" : "sgd";
  } else if (type == "rmsprop" || type == "adagrad" || type == "lion" || type == "adafactor") {
    kind = type;
  } else if (type == "adam8bit" || type == "adamw8bit") {
    kind = "adam8bit";
  } else {
    // 1-bit Adam, 0/1 Adam and 1-bit LAMB compress the gradients' communication after a
    // warm-up: that is not modelled either.
    const bool compressed = type == "onebitadam" || type == "zerooneadam" || type == "onebitlamb";
    note("optimizer.type " + shown(*it) +
         " is not modelled: simulated with Adam's states and step (training.optimizer lists "
         "the optimizers modelled)" +
         (compressed ? "; its compressed (1-bit) gradient communication is not modelled "
                       "either: gradients are reduced uncompressed"
                     : ""));
    kind = "adam";
  }
  set("training.optimizer", kind, "optimizer.type");
}

void DeepSpeedReader::note_unmodelled(const json& root) {
  static const std::vector<std::pair<std::string, std::string>> kUnmodelled = {
      {"sparse_attention", "DeepSpeed's sparse attention is not modelled: attention is dense"},
      {"sparse_gradients",
       "sparse embedding gradients are not modelled: the embedding's gradients are reduced dense"},
      {"communication_data_type",
       "not modelled: gradients are reduced in the type training.grad_accumulation_dtype and "
       "the framework give"},
      {"fp32_allreduce",
       "not modelled: gradients are reduced in the type training.grad_accumulation_dtype and the "
       "framework give"},
      {"seq_parallel_communication_data_type",
       "not modelled: sequence-parallel communication is in the training dtype"},
      {"data_types",
       "not read: gradients accumulate in the type training.grad_accumulation_dtype gives"},
      {"pipeline",
       "DeepSpeed's pipeline-engine settings are not read: the experiment's pipeline "
       "(parallelism.pp, schedule, partition) is simulated"},
      {"progressive_layer_drop", "not modelled: every layer runs in every iteration"},
      {"curriculum_learning",
       "not modelled: every iteration runs at the experiment's sequence length"},
      {"data_efficiency",
       "not modelled: every iteration runs the experiment's batch and sequence length"},
      {"compression_training", "not modelled: the model trains uncompressed"},
      {"quantize_training", "not modelled: the model trains unquantised"},
      {"weight_quantization", "not modelled: the weights are not quantised"},
      {"eigenvalue", "not modelled: no eigenvalue computation is simulated"},
      {"compile", "torch.compile is not modelled: kernels run at the framework's efficiency"},
      {"elasticity", "not modelled: the experiment's batch and world size are simulated"},
      {"hybrid_engine", "not modelled: training only, no generation"},
      {"autotuning", "not run: the config's settings are simulated as given"}};
  for (const auto& [key, message] : kUnmodelled) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) continue;
    if (it->is_object()) {
      auto enabled = it->find("enabled");
      if (enabled != it->end() && enabled->is_boolean() && !enabled->get<bool>()) continue;
    }
    note(key + " " + shown(*it) + ": " + message);
  }
}

// ---------------------------------------------------------------------------------------------
// Megatron-LM.

struct MegatronArg {
  std::string name;  // "--num-layers"
  std::vector<std::string> values;
};

// Arguments that change the experiment: taking one value, or flags taking none.
const std::vector<std::string> kMegatronValued = {"--tensor-model-parallel-size",
                                                  "--pipeline-model-parallel-size",
                                                  "--virtual-pipeline-model-parallel-size",
                                                  "--num-layers-per-virtual-pipeline-stage",
                                                  "--context-parallel-size",
                                                  "--cp-comm-type",
                                                  "--expert-model-parallel-size",
                                                  "--expert-tensor-parallel-size",
                                                  "--num-experts",
                                                  "--moe-router-topk",
                                                  "--moe-ffn-hidden-size",
                                                  "--moe-shared-expert-intermediate-size",
                                                  "--moe-token-dispatcher-type",
                                                  "--moe-router-load-balancing-type",
                                                  "--moe-aux-loss-coeff",
                                                  "--moe-layer-freq",
                                                  "--moe-expert-capacity-factor",
                                                  "--moe-router-num-groups",
                                                  "--moe-router-group-topk",
                                                  "--moe-router-score-function",
                                                  "--moe-expert-parallel-size",
                                                  "--topk",
                                                  "--expert-interval",
                                                  "--mlp-type",
                                                  "--moe-train-capacity-factor",
                                                  "--moe-min-capacity",
                                                  "--moe-loss-coeff",
                                                  "--num-experts-switch",
                                                  "--micro-batch-size",
                                                  "--global-batch-size",
                                                  "--seq-length",
                                                  "--encoder-seq-length",
                                                  "--num-layers",
                                                  "--hidden-size",
                                                  "--ffn-hidden-size",
                                                  "--num-attention-heads",
                                                  "--num-query-groups",
                                                  "--kv-channels",
                                                  "--vocab-size",
                                                  "--padded-vocab-size",
                                                  "--max-position-embeddings",
                                                  "--position-embedding-type",
                                                  "--normalization",
                                                  "--recompute-granularity",
                                                  "--recompute-method",
                                                  "--recompute-num-layers",
                                                  "--optimizer",
                                                  "--hidden-dropout",
                                                  "--attention-dropout",
                                                  "--clip-grad",
                                                  "--loss-scale",
                                                  "--fp8-format",
                                                  "--fp8-recipe",
                                                  "--fp8-amax-history-len",
                                                  "--fp8-amax-compute-algo",
                                                  "--fp4-format",
                                                  "--fp4-recipe",
                                                  "--num-layers-at-start-in-bf16",
                                                  "--num-layers-at-end-in-bf16",
                                                  "--deepspeed_config",
                                                  "--attention-backend",
                                                  "--zero-stage"};
const std::vector<std::string> kMegatronFlags = {"--sequence-parallel",
                                                 "--moe-grouped-gemm",
                                                 "--moe-shared-expert-overlap",
                                                 "--disable-moe-token-dropping",
                                                 "--enable-expert-tensor-parallelism",
                                                 "--use-tutel",
                                                 "--deepspeed",
                                                 "--no-scatter-gather-tensors-in-pipeline",
                                                 "--no-overlap-p2p-communication",
                                                 "--group-query-attention",
                                                 "--swiglu",
                                                 "--squared-relu",
                                                 "--qk-layernorm",
                                                 "--add-qkv-bias",
                                                 "--untie-embeddings-and-output-weights",
                                                 "--disable-bias-linear",
                                                 "--add-bias-linear",
                                                 "--use-rotary-position-embeddings",
                                                 "--bf16",
                                                 "--fp16",
                                                 "--recompute-activations",
                                                 "--checkpoint-activations",
                                                 "--distribute-saved-activations",
                                                 "--use-flash-attn",
                                                 "--use-distributed-optimizer",
                                                 "--overlap-grad-reduce",
                                                 "--overlap-param-gather",
                                                 "--tp-comm-overlap",
                                                 "--accumulate-allreduce-grads-in-fp32",
                                                 "--fp8-param-gather",
                                                 "--fp4-param-gather",
                                                 "--first-last-layers-bf16",
                                                 "--fp8-dot-product-attention",
                                                 "--fp8-multi-head-attention",
                                                 "--no-fp8-wgrad"};
// Common arguments that do not change what is simulated (hyper-parameters, data, logging,
// checkpoints, fusions): accepted silently, whatever values follow them.
const std::vector<std::string> kMegatronIgnored = {"--lr",
                                                   "--min-lr",
                                                   "--lr-decay-style",
                                                   "--lr-decay-iters",
                                                   "--lr-decay-samples",
                                                   "--lr-warmup-fraction",
                                                   "--lr-warmup-iters",
                                                   "--lr-warmup-samples",
                                                   "--lr-warmup-init",
                                                   "--train-iters",
                                                   "--train-samples",
                                                   "--weight-decay",
                                                   "--start-weight-decay",
                                                   "--end-weight-decay",
                                                   "--adam-beta1",
                                                   "--adam-beta2",
                                                   "--adam-eps",
                                                   "--init-method-std",
                                                   "--data-path",
                                                   "--vocab-file",
                                                   "--merge-file",
                                                   "--tokenizer-type",
                                                   "--tokenizer-model",
                                                   "--split",
                                                   "--save",
                                                   "--load",
                                                   "--save-interval",
                                                   "--eval-interval",
                                                   "--eval-iters",
                                                   "--log-interval",
                                                   "--tensorboard-dir",
                                                   "--distributed-backend",
                                                   "--seed",
                                                   "--make-vocab-size-divisible-by",
                                                   "--data-impl",
                                                   "--num-workers",
                                                   "--timing-log-level",
                                                   "--transformer-impl",
                                                   "--initial-loss-scale",
                                                   "--min-loss-scale",
                                                   "--loss-scale-window",
                                                   "--hysteresis",
                                                   "--DDP-impl",
                                                   "--rotary-percent",
                                                   "--rotary-base",
                                                   "--layernorm-epsilon",
                                                   "--norm-epsilon",
                                                   "--exit-interval",
                                                   "--exit-duration-in-mins",
                                                   "--wandb-project",
                                                   "--wandb-exp-name",
                                                   "--wandb-save-dir",
                                                   "--decoder-seq-length",
                                                   "--tensorboard-log-interval",
                                                   "--ckpt-format",
                                                   "--dataloader-type",
                                                   "--data-cache-path",
                                                   "--pipeline-model-parallel-split-rank",
                                                   "--no-masked-softmax-fusion",
                                                   "--no-bias-gelu-fusion",
                                                   "--no-bias-dropout-fusion",
                                                   "--no-bias-swiglu-fusion",
                                                   "--no-rope-fusion",
                                                   "--log-params-norm",
                                                   "--log-num-zeros-in-grad",
                                                   "--use-mcore-models",
                                                   "--no-async-tensor-model-parallel-allreduce",
                                                   "--no-gradient-accumulation-fusion",
                                                   "--apply-layernorm-1p",
                                                   "--attention-softmax-in-fp32",
                                                   "--use-checkpoint-args",
                                                   "--no-load-optim",
                                                   "--no-load-rng",
                                                   "--finetune",
                                                   "--log-throughput",
                                                   "--log-timers-to-tensorboard",
                                                   "--log-validation-ppl-to-tensorboard",
                                                   "--log-memory-to-tensorboard",
                                                   "--no-query-key-layer-scaling",
                                                   "--use-cpu-initialization",
                                                   "--empty-unused-memory-level",
                                                   "--manual-gc",
                                                   "--bf16-param-gather",
                                                   "--fp8-margin",
                                                   "--fp8-interval",
                                                   "--rampup-batch-size",
                                                   "--eod-mask-loss",
                                                   "--reset-position-ids",
                                                   "--reset-attention-mask",
                                                   "--mock-data",
                                                   "--tokenizer-name-or-path",
                                                   "--ckpt-fully-parallel-save",
                                                   "--async-save",
                                                   "--use-dist-ckpt",
                                                   "--dist-ckpt-format",
                                                   "--no-create-attention-mask-in-dataloader",
                                                   "--moe-eval-capacity-factor",
                                                   "--create-moe-param-group",
                                                   "--disable-moe-top2-2nd-expert-sampling",
                                                   "--cross-entropy-loss-fusion",
                                                   "--calculate-per-token-loss",
                                                   "--no-mmap-bin-files",
                                                   "--profile",
                                                   "--profile-step-start",
                                                   "--profile-step-end",
                                                   "--profile-ranks",
                                                   "--distributed-timeout-minutes",
                                                   "--decoupled-lr",
                                                   "--decoupled-min-lr",
                                                   "--logging-level",
                                                   "--no-check-for-nan-in-loss-and-grad",
                                                   "--init-model-with-meta-device",
                                                   "--fsdp-manual-registration",
                                                   "--no-position-embedding",
                                                   "--record-memory-history",
                                                   "--num-dataset-builder-threads",
                                                   "--object-storage-cache-path",
                                                   "--ckpt-assume-constant-structure",
                                                   "--override-opt_param-scheduler",
                                                   "--repeated-dataloader",
                                                   "--zero-reduce-scatter",
                                                   "--zero-contigious-gradients",
                                                   "--deepspeed-activation-checkpointing",
                                                   "--no-pipeline-parallel",
                                                   "--lr-decay-tokens",
                                                   "--lr-warmup-tokens",
                                                   "--train-tokens",
                                                   "--tensorboard-queue-size",
                                                   "--log-batch-size-to-tensorboard",
                                                   "--log-optimizer-states-to-tensorboard"};
// Arguments that change what a run costs but are not modelled: accepted with a note (whatever
// values follow them).
const std::vector<std::pair<std::string, std::string>> kMegatronNoted = {
    {"--grad-reduce-in-bf16",
     "gradients reduced in bf16 is not modelled: they are reduced in the type "
     "training.grad_accumulation_dtype and the framework give"},
    {"--use-megatron-fsdp",
     "Megatron FSDP is not read from the arguments: give the sharding with stratasim's --fsdp "
     "or --zero 3"},
    {"--use-torch-fsdp2",
     "PyTorch FSDP2 is not read from the arguments: give the sharding with stratasim's --fsdp "
     "or --zero 3"},
    {"--data-parallel-sharding-strategy",
     "is not read (Megatron FSDP): give the sharding with stratasim's --fsdp or --zero"},
    {"--use-nccl-ub", "NCCL user buffers are not modelled"},
    {"--cpu-optimizer",
     "(Megatron-DeepSpeed) is not read: the optimizer's offload comes from the DeepSpeed "
     "config's zero_optimization.offload_optimizer (or --offload optimizer)"},
    {"--fsdp-double-buffer", "is not modelled (Megatron FSDP)"},
    {"--step-batch-size-schedule",
     "a batch-size ramp is not modelled: every iteration runs --global-batch-size"},
    {"--moe-router-dtype", "is not modelled: the router runs in the training dtype"},
    {"--recompute-modules",
     "is not read: --recompute-granularity and --recompute-method choose what is recomputed"}};

std::vector<MegatronArg> parse_megatron(const std::vector<std::string>& words,
                                        const std::string& source, ForeignInput& out) {
  std::vector<MegatronArg> args;
  std::size_t stray = 0;
  for (const auto& w : words) {
    if (w.rfind("--", 0) == 0 && w.size() > 2) {
      MegatronArg a;
      const auto eq = w.find('=');
      a.name = w.substr(0, eq);
      if (eq != std::string::npos) a.values.push_back(w.substr(eq + 1));
      args.push_back(std::move(a));
    } else if (!args.empty()) {
      args.back().values.push_back(w);
    } else {
      ++stray;  // "torchrun ... pretrain_gpt.py" before the arguments
    }
  }
  if (stray > 0) {
    out.notes.push_back(source + ": " + std::to_string(stray) +
                        " word(s) before the first --argument ignored");
  }
  return args;
}

class MegatronReader : foreign::Reader {
 public:
  explicit MegatronReader(std::string source) : Reader(std::move(source)) {}

  ForeignInput read(std::string_view text);

 private:
  // The cluster sized by the launch line (strategies/launch_line.hpp): cluster.nodes and
  // cluster.devices_per_node; the device and the network stay the experiment cluster's.
  void map_world(const LaunchLine& launch);
  // --deepspeed_config FILE (or --deepspeed FILE): the DeepSpeed config, read as stratasim's
  // --deepspeed reads it, its overrides before the arguments' own.
  void map_deepspeed_config();

  static bool contains(const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  }
  // The largest parallel degree an argument may give.
  static constexpr std::int64_t kDegree = 1 << 24;

  // A parallel degree: `path` set from `arg` when it is given (1 to kDegree).
  void set_degree(const std::string& path, const char* arg) {
    if (has(arg)) set(path, integer(arg, 1, kDegree), arg);
  }

  /// Reader::set, its origin the argument with its value ("--tp 8").
  void set(const std::string& path, json value, const std::string& arg) {
    auto it = values_.find(arg);
    Reader::set(path, std::move(value), it == values_.end() ? arg : arg + " " + it->second);
  }
  bool has(const std::string& arg) const { return values_.contains(arg); }
  bool flag(const std::string& arg) const { return flags_.contains(arg); }

  std::int64_t integer(const std::string& arg, std::int64_t lo, std::int64_t hi) const;
  double number(const std::string& arg, double lo, double hi) const;
  std::string choice(const std::string& arg, const std::vector<std::string>& options) const;

  // Megatron-LM's context parallelism: --context-parallel-size (cp; dp is what remains of the
  // world), --cp-comm-type p2p (TE's ring), a2a (Ulysses), allgather; Megatron's context
  // parallelism runs Transformer Engine's fused attention, so flash attention is on.
  void map_context_parallel();

  void map();

  // FP8 and FP4 training (strategies/precision.hpp): --fp8-format or --fp4-format turns it on
  // (Megatron-LM ignores the other fp8 / fp4 arguments without them); Megatron's defaults
  // where an argument is not given: --fp8-recipe delayed, --fp8-amax-history-len 1,
  // --fp8-amax-compute-algo most_recent, 1 layer at each end with --first-last-layers-bf16.
  void map_low_precision();

  // Dropout and gradient clipping as the run has them: the argument, or Megatron-LM's default
  // (0.1 for both dropouts, --clip-grad 1.0). --loss-scale fixes the fp16 loss scale (static);
  // without it Megatron scales dynamically, training.loss_scaling's default with fp16.
  void map_regularisation();

  void map_recompute();

  void map_model();

  // Megatron-Core's MoE arguments (megatron/training/arguments.py, _add_moe_args): the
  // model's experts (model.moe) and their parallel layout (parallelism.ep, etp, moe_*).
  void map_moe();

  // Megatron-DeepSpeed's MoE (microsoft/Megatron-DeepSpeed, megatron/arguments.py and
  // megatron/model/transformer.py: deepspeed.moe.layer.MoE in ParallelTransformerLayer):
  // --num-experts (one count, or one per MoE layer) experts on every --expert-interval-th layer
  // (default 2: layers interval - 1, 2 interval - 1, ...; get_num_experts_per_layer), top
  // --topk (default 1) of a softmax gate, each expert the model's MLP; --moe-expert-parallel-size
  // ranks share a layer's experts; capacity --moe-train-capacity-factor (default 1.0) unless
  // --disable-moe-token-dropping; --moe-loss-coeff (default 0.1); --mlp-type residual (PR-MoE's
  // residual MLP) a dense MLP of the same width every token goes through, mixed by a learned
  // coefficient. Whether these (rather than Megatron-Core's) are in use.
  static constexpr const char* kDeepSpeedMoeArgs[] = {
      "--moe-expert-parallel-size", "--topk",
      "--expert-interval",          "--mlp-type",
      "--moe-min-capacity",         "--moe-train-capacity-factor",
      "--moe-loss-coeff",           "--num-experts-switch"};
  static constexpr const char* kDeepSpeedMoeFlags[] = {
      "--disable-moe-token-dropping", "--enable-expert-tensor-parallelism", "--use-tutel"};
  // The first Megatron-DeepSpeed MoE argument given (or --deepspeed with --num-experts), or "".
  std::string deepspeed_moe_arg() const;

  void map_deepspeed_moe(const std::string& marker, const std::vector<const char*>& core_args);

  // The MLP's width: --ffn-hidden-size, or Megatron's default from --hidden-size (4h, or 2/3 of
  // it rounded down to a multiple of 64 with SwiGLU); none without either.
  std::optional<std::int64_t> ffn_width() const;

  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
  std::vector<std::string> num_experts_;  // --num-experts' values (Megatron-DeepSpeed: several)
};

ForeignInput MegatronReader::read(std::string_view text) {
  const LaunchLine launch = read_launch_line(split_shell_words(text, source_), source_);
  const auto args = parse_megatron(launch.args, source_, out_);
  for (const auto& a : args) {
    const bool valued = contains(kMegatronValued, a.name);
    const bool flag = contains(kMegatronFlags, a.name);
    if (a.name == "--deepspeed" && a.values.size() == 1) {
      // Hugging Face Trainer's --deepspeed ds_config.json: the config file.
      values_["--deepspeed_config"] = a.values.front();
      flags_.insert(a.name);
    } else if (a.name == "--num-experts" && !a.values.empty()) {
      // Megatron-DeepSpeed's --num-experts takes one count per MoE layer (nargs='+').
      num_experts_ = a.values;
      values_[a.name] = a.values.front();
    } else if (valued) {
      if (a.values.size() != 1) {
        fail(a.name, "expects one value, got " + std::to_string(a.values.size()));
      }
      values_[a.name] = a.values.front();  // the last one wins, as with argparse
    } else if (flag) {
      if (!a.values.empty()) {
        fail(a.name, "is a flag and takes no value, got " + quote_text(a.values.front()));
      }
      flags_.insert(a.name);
    } else if (auto noted = std::find_if(kMegatronNoted.begin(), kMegatronNoted.end(),
                                         [&](const auto& n) { return n.first == a.name; });
               noted != kMegatronNoted.end()) {
      note(a.name + " " + noted->second);
    } else if (!contains(kMegatronIgnored, a.name)) {
      std::vector<std::string> mapped = kMegatronValued;
      mapped.insert(mapped.end(), kMegatronFlags.begin(), kMegatronFlags.end());
      const std::string typo = closest_mapped(a.name, mapped);
      if (!typo.empty()) fail(a.name, "unknown argument; did you mean " + typo + "?");
      mapped.insert(mapped.end(), kMegatronIgnored.begin(), kMegatronIgnored.end());
      const std::string hint = suggestion(a.name, mapped);
      out_.notes.push_back(source_ + ": unknown argument " + quote_text(a.name) + " ignored" +
                           (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    }
  }
  map();
  map_world(launch);
  map_deepspeed_config();
  return std::move(out_);
}

std::int64_t MegatronReader::integer(const std::string& arg, std::int64_t lo,
                                     std::int64_t hi) const {
  const std::string& text = values_.at(arg);
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < lo || v > hi) {
    fail(arg, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                  ", got " + quote_text(text));
  }
  return v;
}

double MegatronReader::number(const std::string& arg, double lo, double hi) const {
  const std::string& text = values_.at(arg);
  double v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || !(v >= lo && v <= hi)) {
    std::ostringstream range;
    range << lo << " to " << hi;
    fail(arg, "expected a number from " + range.str() + ", got " + quote_text(text));
  }
  return v;
}

std::string MegatronReader::choice(const std::string& arg,
                                   const std::vector<std::string>& options) const {
  const std::string& text = values_.at(arg);
  if (std::find(options.begin(), options.end(), text) != options.end()) return text;
  std::string list;
  for (const auto& o : options) list += (list.empty() ? "" : ", ") + o;
  const std::string hint = suggestion(text, options);
  fail(arg, "expected one of " + list + ", got " + quote_text(text) +
                (hint.empty() ? "" : " (did you mean " + hint + "?)"));
}

void MegatronReader::map_context_parallel() {
  const bool size = has("--context-parallel-size");
  const std::int64_t cp = size ? integer("--context-parallel-size", 1, kDegree) : 1;
  if (size) {
    set("parallelism.cp", cp, "--context-parallel-size");
    if (!has("--tensor-model-parallel-size") && !has("--pipeline-model-parallel-size")) {
      out_.overrides.push_back(
          {"parallelism.dp", nullptr, source_ + " (dp = world / (tp x cp x pp))"});
    }
    if (cp > 1) set("training.flash_attention", true, "--context-parallel-size");
  }
  if (!has("--cp-comm-type")) return;
  const std::string type = choice("--cp-comm-type", {"p2p", "a2a", "allgather", "a2a+p2p"});
  if (type == "a2a+p2p") {
    fail("--cp-comm-type",
         "a2a+p2p (hierarchical context parallelism) is not modelled; use p2p, a2a or "
         "allgather");
  }
  set("parallelism.cp_mode",
      type == "p2p"   ? "ring"
      : type == "a2a" ? "ulysses"
                      : "allgather",
      "--cp-comm-type");
}

void MegatronReader::map() {
  // Parallelism.
  set_degree("parallelism.tp", "--tensor-model-parallel-size");
  set_degree("parallelism.pp", "--pipeline-model-parallel-size");
  if (has("--tensor-model-parallel-size") || has("--pipeline-model-parallel-size")) {
    // Megatron's data-parallel size is what remains of the world, as with --tp and --pp.
    out_.overrides.push_back({"parallelism.dp", nullptr, source_ + " (dp = world / (tp x pp))"});
  }
  map_context_parallel();
  map_moe();
  if (flag("--deepspeed") && !has("--deepspeed_config")) {
    note("--deepspeed without --deepspeed_config: no DeepSpeed config read");
  }
  int vpp = 0;
  if (has("--virtual-pipeline-model-parallel-size")) {
    vpp = static_cast<int>(integer("--virtual-pipeline-model-parallel-size", 1, 1 << 12));
  }
  if (has("--num-layers-per-virtual-pipeline-stage")) {
    const auto per = integer("--num-layers-per-virtual-pipeline-stage", 1, 100'000);
    if (!has("--num-layers") || !has("--pipeline-model-parallel-size")) {
      fail("--num-layers-per-virtual-pipeline-stage",
           "needs --num-layers and --pipeline-model-parallel-size among the arguments to give "
           "the virtual stages (num_layers / pp / this)");
    }
    const auto layers = integer("--num-layers", 1, 100'000);
    const auto pp = integer("--pipeline-model-parallel-size", 1, kDegree);
    if (layers % (pp * per) != 0) {
      fail("--num-layers-per-virtual-pipeline-stage",
           "--num-layers (" + std::to_string(layers) + ") must be divisible by pp x this (" +
               std::to_string(pp) + " x " + std::to_string(per) + ")");
    }
    vpp = static_cast<int>(layers / (pp * per));
  }
  if (vpp > 1) {
    const std::string arg = has("--virtual-pipeline-model-parallel-size")
                                ? "--virtual-pipeline-model-parallel-size"
                                : "--num-layers-per-virtual-pipeline-stage";
    set("parallelism.schedule", "interleaved", arg);
    set("parallelism.virtual_stages", vpp, arg);
  }
  if (flag("--sequence-parallel"))
    set("parallelism.sequence_parallel", true, "--sequence-parallel");
  if (flag("--tp-comm-overlap")) {
    set("parallelism.tp_comm_overlap", true, "--tp-comm-overlap");
  }
  if (flag("--no-overlap-p2p-communication")) {
    set("parallelism.pipeline_batched_p2p", true, "--no-overlap-p2p-communication");
  }
  if (flag("--no-scatter-gather-tensors-in-pipeline")) {
    set("parallelism.pipeline_scatter_gather", false, "--no-scatter-gather-tensors-in-pipeline");
  }
  if (has("--micro-batch-size")) {
    set("parallelism.micro_batch", integer("--micro-batch-size", 1, kDegree), "--micro-batch-size");
  }
  if (has("--global-batch-size")) {
    set("training.global_batch", integer("--global-batch-size", 1, std::int64_t{1} << 40),
        "--global-batch-size");
  }
  for (const char* arg : {"--seq-length", "--encoder-seq-length"}) {
    if (has(arg)) set("training.seq_len", integer(arg, 1, 1 << 24), arg);
  }
  if (flag("--bf16") && flag("--fp16")) fail("--fp16", "contradicts --bf16: give one of them");
  if (flag("--bf16")) set("training.dtype", "bf16", "--bf16");
  if (flag("--fp16")) set("training.dtype", "fp16", "--fp16");
  if (flag("--use-flash-attn")) set("training.flash_attention", true, "--use-flash-attn");
  if (has("--attention-backend")) {
    // Megatron-Core's AttnBackend: flash and fused (cuDNN) are fused attention kernels, auto
    // picks one of them (Transformer Engine); unfused and local materialise the scores.
    const std::string backend =
        choice("--attention-backend", {"flash", "fused", "unfused", "local", "auto"});
    set("training.flash_attention", backend != "unfused" && backend != "local",
        "--attention-backend");
  }
  map_low_precision();
  // Megatron-LM's defaults around the layers (strategies/framework.hpp): fp32 main grads
  // with bf16, the distributed optimizer when asked for.
  set("training.framework", "megatron", "Megatron-LM arguments");
  if (flag("--use-distributed-optimizer")) {
    set("training.distributed_optimizer", true, "--use-distributed-optimizer");
  }
  // Megatron-DeepSpeed's --zero-stage (its model code's view of the DeepSpeed config's stage).
  if (has("--zero-stage")) set("parallelism.zero", integer("--zero-stage", 0, 3), "--zero-stage");
  if (flag("--accumulate-allreduce-grads-in-fp32")) {
    set("training.grad_accumulation_dtype", "fp32", "--accumulate-allreduce-grads-in-fp32");
  }
  if (flag("--overlap-grad-reduce")) set("parallelism.dp_overlap", true, "--overlap-grad-reduce");
  if (flag("--overlap-param-gather")) {
    set("parallelism.overlap_param_gather", true, "--overlap-param-gather");
  }
  if (has("--optimizer")) {
    // Megatron's sgd is torch.optim.SGD with momentum --sgd-momentum (default 0.9).
    const bool sgd = choice("--optimizer", {"adam", "sgd"}) == "sgd";
    set("training.optimizer", sgd ? "sgd_momentum" : "adam", "--optimizer");
  }
  map_regularisation();
  map_recompute();
  map_model();
}

void MegatronReader::map_low_precision() {
  const bool fp8 = has("--fp8-format"), fp4 = has("--fp4-format");
  if (fp8 && fp4) fail("--fp4-format", "contradicts --fp8-format: give one of them");
  if (!fp8 && !fp4) {
    for (const char* arg : {"--fp8-recipe", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
                            "--fp4-recipe", "--fp8-param-gather", "--fp4-param-gather",
                            "--fp8-dot-product-attention", "--first-last-layers-bf16"}) {
      if (has(arg) || flag(arg)) {
        note(std::string(arg) + " has no effect without --fp8-format or --fp4-format");
      }
    }
    return;
  }
  const auto defaulted = [&](const std::string& path, json value, const std::string& what) {
    out_.overrides.push_back(
        {path, std::move(value), source_ + " (Megatron-LM's default " + what + ")"});
  };
  if (fp8) {
    set("training.dtype", "fp8", "--fp8-format");
    set("training.fp8.format", choice("--fp8-format", {"e4m3", "hybrid"}), "--fp8-format");
    if (has("--fp8-recipe")) {
      const std::string r = choice("--fp8-recipe", {"delayed", "tensorwise", "blockwise", "mxfp8"});
      set("training.fp8.recipe",
          r == "tensorwise"  ? "current"
          : r == "blockwise" ? "block"
                             : r,
          "--fp8-recipe");
    } else {
      defaulted("training.fp8.recipe", "delayed", "--fp8-recipe delayed");
    }
    if (has("--fp8-amax-history-len")) {
      set("training.fp8.amax_history_len", integer("--fp8-amax-history-len", 1, 1 << 20),
          "--fp8-amax-history-len");
    } else {
      defaulted("training.fp8.amax_history_len", 1, "--fp8-amax-history-len 1");
    }
    if (has("--fp8-amax-compute-algo")) {
      set("training.fp8.amax_compute_algo",
          choice("--fp8-amax-compute-algo", {"most_recent", "max"}), "--fp8-amax-compute-algo");
    } else {
      defaulted("training.fp8.amax_compute_algo", "most_recent",
                "--fp8-amax-compute-algo most_recent");
    }
  } else {
    set("training.dtype", "fp4", "--fp4-format");
    choice("--fp4-format", {"e2m1"});
    if (has("--fp4-recipe")) choice("--fp4-recipe", {"nvfp4"});
    set("training.fp8.recipe", "nvfp4", has("--fp4-recipe") ? "--fp4-recipe" : "--fp4-format");
  }
  for (const char* arg : {"--fp8-param-gather", "--fp4-param-gather"}) {
    if (flag(arg)) set("training.fp8.param_gather", true, arg);
  }
  if (flag("--fp8-dot-product-attention")) {
    set("training.fp8.attention", true, "--fp8-dot-product-attention");
  }
  if (flag("--first-last-layers-bf16")) {
    for (auto [arg, key] : {std::pair{"--num-layers-at-start-in-bf16", "bf16_first_layers"},
                            std::pair{"--num-layers-at-end-in-bf16", "bf16_last_layers"}}) {
      const std::string path = std::string("training.fp8.") + key;
      if (has(arg)) {
        set(path, integer(arg, 0, 1 << 20), arg);
      } else {
        defaulted(path, 1, std::string(arg) + " 1");
      }
    }
  }
  if (flag("--fp8-multi-head-attention")) {
    note(
        "--fp8-multi-head-attention is not modelled beyond --fp8-dot-product-attention (the "
        "attention block's casts are costed as without it)");
  }
  if (flag("--no-fp8-wgrad")) {
    note("--no-fp8-wgrad is not modelled: the weight-gradient GEMMs are costed in FP8");
  }
}

void MegatronReader::map_regularisation() {
  for (const auto& [arg, path] :
       {std::pair<std::string, std::string>{"--hidden-dropout", "training.hidden_dropout"},
        {"--attention-dropout", "training.attention_dropout"}}) {
    if (has(arg)) {
      const double p = number(arg, 0.0, 1.0);
      if (auto problem = dropout_problem(p)) fail(arg, *problem);
      set(path, p, arg);
    } else {
      out_.overrides.push_back({path, 0.1, source_ + " (Megatron-LM's default " + arg + " 0.1)"});
    }
  }
  if (has("--clip-grad")) {
    set("training.grad_clip", number("--clip-grad", 0.0, 1e12), "--clip-grad");
  } else {
    out_.overrides.push_back(
        {"training.grad_clip", 1.0, source_ + " (Megatron-LM's default --clip-grad 1.0)"});
  }
  if (has("--loss-scale")) {
    number("--loss-scale", 0.0, 1e38);
    set("training.loss_scaling", "static", "--loss-scale");
  }
}

void MegatronReader::map_recompute() {
  std::string granularity;
  std::string arg;
  if (has("--recompute-granularity")) {
    granularity = choice("--recompute-granularity", {"full", "selective"});
    arg = "--recompute-granularity";
  }
  for (const auto& [legacy, kind] :
       {std::pair<std::string, std::string>{"--recompute-activations", "selective"},
        {"--checkpoint-activations", "full"}}) {
    if (!flag(legacy)) continue;
    if (!granularity.empty() && granularity != kind) {
      fail(legacy, "means --recompute-granularity " + kind + ", which contradicts " + arg);
    }
    granularity = kind;
    arg = legacy;
  }
  if (!granularity.empty()) set("parallelism.recompute", granularity, arg);
  if (has("--recompute-method")) {
    set("parallelism.recompute_method", choice("--recompute-method", {"uniform", "block"}),
        "--recompute-method");
  }
  if (has("--recompute-num-layers")) {
    set("parallelism.recompute_num_layers", integer("--recompute-num-layers", 1, 1 << 16),
        "--recompute-num-layers");
  }
  if (flag("--distribute-saved-activations")) {
    note(
        "--distribute-saved-activations is not modelled: checkpoints are kept whole on every "
        "tensor-parallel rank");
  }
}

void MegatronReader::map_model() {
  constexpr std::int64_t kBig = 1 << 24;
  if (has("--num-layers")) set("model.layers", integer("--num-layers", 1, 100'000), "--num-layers");
  std::optional<std::int64_t> hidden, heads;
  if (has("--hidden-size")) {
    hidden = integer("--hidden-size", 1, kBig);
    set("model.hidden", *hidden, "--hidden-size");
  }
  if (has("--ffn-hidden-size")) {
    set("model.ffn_hidden", integer("--ffn-hidden-size", 1, kBig), "--ffn-hidden-size");
  } else if (hidden) {
    const std::int64_t ffn = *ffn_width();
    if (ffn < 1) fail("--hidden-size", "gives no FFN width; give --ffn-hidden-size");
    set("model.ffn_hidden", ffn, "--hidden-size");
    note("--ffn-hidden-size not given: " + std::to_string(ffn) + " as Megatron derives it from " +
         "--hidden-size");
  }
  if (has("--num-attention-heads")) {
    heads = integer("--num-attention-heads", 1, kBig);
    set("model.heads", *heads, "--num-attention-heads");
    if (!flag("--group-query-attention")) set("model.kv_heads", *heads, "--num-attention-heads");
  }
  if (flag("--group-query-attention")) {
    const std::int64_t groups =
        has("--num-query-groups") ? integer("--num-query-groups", 1, kBig) : 1;
    set("model.kv_heads", groups,
        has("--num-query-groups") ? "--num-query-groups" : "--group-query-attention");
  } else if (has("--num-query-groups")) {
    integer("--num-query-groups", 1, kBig);
    note("--num-query-groups is ignored without --group-query-attention (as in Megatron)");
  }
  if (has("--kv-channels")) {  // the head width; Megatron's default is hidden / heads
    const auto kv = integer("--kv-channels", 1, kBig);
    if (!hidden || !heads || kv * *heads != *hidden) set("model.head_dim", kv, "--kv-channels");
  }
  if (flag("--swiglu") && flag("--squared-relu")) {
    fail("--squared-relu", "contradicts --swiglu");
  }
  if (flag("--swiglu")) set("model.activation", "swiglu", "--swiglu");
  if (flag("--squared-relu")) set("model.activation", "squared_relu", "--squared-relu");
  if (flag("--qk-layernorm")) set("model.qk_norm", true, "--qk-layernorm");
  if (flag("--add-qkv-bias")) set("model.qkv_bias", true, "--add-qkv-bias");
  if (flag("--untie-embeddings-and-output-weights")) {
    set("model.tied_embeddings", false, "--untie-embeddings-and-output-weights");
  }
  for (const char* arg : {"--vocab-size", "--padded-vocab-size"}) {
    if (has(arg)) set("model.vocab", integer(arg, 1, 1 << 30), arg);
  }
  if (has("--max-position-embeddings")) {
    set("model.max_seq_len", integer("--max-position-embeddings", 1, kBig),
        "--max-position-embeddings");
  }
  if (has("--position-embedding-type")) {
    const auto type = choice("--position-embedding-type", {"learned_absolute", "rope"});
    set("model.position_embedding", type == "rope" ? "rotary" : "learned",
        "--position-embedding-type");
  }
  if (flag("--use-rotary-position-embeddings")) {
    set("model.position_embedding", "rotary", "--use-rotary-position-embeddings");
  }
  if (has("--normalization")) {
    // Megatron-LM's choices; Megatron-DeepSpeed's argparse has them in lower case.
    const std::string norm =
        choice("--normalization", {"LayerNorm", "RMSNorm", "layernorm", "rmsnorm"});
    set("model.norm", norm == "RMSNorm" || norm == "rmsnorm" ? "rmsnorm" : "layernorm",
        "--normalization");
  }
  if (flag("--disable-bias-linear") && flag("--add-bias-linear")) {
    fail("--add-bias-linear", "contradicts --disable-bias-linear");
  }
  if (flag("--disable-bias-linear")) set("model.bias", false, "--disable-bias-linear");
  if (flag("--add-bias-linear")) set("model.bias", true, "--add-bias-linear");
}

void MegatronReader::map_moe() {
  const char* model_args[] = {"--moe-router-topk",
                              "--moe-ffn-hidden-size",
                              "--moe-shared-expert-intermediate-size",
                              "--moe-router-load-balancing-type",
                              "--moe-aux-loss-coeff",
                              "--moe-layer-freq",
                              "--moe-expert-capacity-factor",
                              "--moe-router-num-groups",
                              "--moe-router-group-topk",
                              "--moe-router-score-function"};
  if (const std::string marker = deepspeed_moe_arg(); !marker.empty()) {
    std::vector<const char*> core(std::begin(model_args), std::end(model_args));
    core.insert(core.end(), {"--expert-model-parallel-size", "--expert-tensor-parallel-size",
                             "--moe-token-dispatcher-type", "--moe-grouped-gemm",
                             "--moe-shared-expert-overlap"});
    map_deepspeed_moe(marker, core);
    return;
  }
  set_degree("parallelism.ep", "--expert-model-parallel-size");
  set_degree("parallelism.etp", "--expert-tensor-parallel-size");
  if (has("--moe-token-dispatcher-type")) {
    const std::string type =
        choice("--moe-token-dispatcher-type", {"allgather", "alltoall", "alltoall_seq", "flex"});
    if (type == "flex") {
      fail("--moe-token-dispatcher-type",
           "flex (DeepEP's fused dispatcher) is not modelled; use alltoall or allgather");
    }
    set("parallelism.moe_token_dispatcher", type == "allgather" ? "allgather" : "alltoall",
        "--moe-token-dispatcher-type");
  }
  if (flag("--moe-grouped-gemm")) set("parallelism.moe_grouped_gemm", true, "--moe-grouped-gemm");
  if (flag("--moe-shared-expert-overlap")) {
    set("parallelism.moe_shared_expert_overlap", true, "--moe-shared-expert-overlap");
  }
  if (!has("--num-experts")) {
    for (const char* arg : model_args) {
      if (has(arg)) fail(arg, "configures experts: it needs --num-experts");
    }
    return;
  }
  set("model.moe.num_experts", integer("--num-experts", 1, 1 << 20), "--num-experts");
  // Megatron's defaults: top-2, the expert FFN of --ffn-hidden-size, every layer.
  set("model.moe.top_k", has("--moe-router-topk") ? integer("--moe-router-topk", 1, 1 << 20) : 2,
      "--moe-router-topk");
  if (has("--moe-ffn-hidden-size")) {
    set("model.moe.ffn_hidden", integer("--moe-ffn-hidden-size", 1, 1 << 24),
        "--moe-ffn-hidden-size");
  } else if (has("--ffn-hidden-size")) {
    set("model.moe.ffn_hidden", integer("--ffn-hidden-size", 1, 1 << 24), "--ffn-hidden-size");
  } else {
    fail("--num-experts", "needs --moe-ffn-hidden-size (or --ffn-hidden-size) for the experts");
  }
  if (has("--moe-shared-expert-intermediate-size")) {
    set("model.moe.shared_experts", 1, "--moe-shared-expert-intermediate-size");
    set("model.moe.shared_ffn_hidden", integer("--moe-shared-expert-intermediate-size", 1, 1 << 24),
        "--moe-shared-expert-intermediate-size");
  }
  if (has("--moe-layer-freq")) {
    // An integer: every n-th layer; Megatron's list form ("([0]*3+[1]*58)") is refused.
    set("model.moe.interval", integer("--moe-layer-freq", 1, 100'000), "--moe-layer-freq");
  }
  if (has("--moe-router-load-balancing-type")) {
    choice("--moe-router-load-balancing-type", {"aux_loss", "seq_aux_loss", "sinkhorn", "none"});
  }
  if (has("--moe-aux-loss-coeff")) {
    set("model.moe.aux_loss_coeff", number("--moe-aux-loss-coeff", 0, 1e6), "--moe-aux-loss-coeff");
  }
  if (has("--moe-expert-capacity-factor")) {
    set("model.moe.capacity_factor", number("--moe-expert-capacity-factor", 1e-6, 1e6),
        "--moe-expert-capacity-factor");
  }
  if (has("--moe-router-score-function") &&
      choice("--moe-router-score-function", {"softmax", "sigmoid"}) == "sigmoid") {
    set("model.moe.router", "sigmoid_group_topk", "--moe-router-score-function");
  }
  if (has("--moe-router-num-groups")) {
    set("model.moe.groups", integer("--moe-router-num-groups", 1, 1 << 20),
        "--moe-router-num-groups");
  }
  if (has("--moe-router-group-topk")) {
    set("model.moe.topk_groups", integer("--moe-router-group-topk", 1, 1 << 20),
        "--moe-router-group-topk");
  }
}

std::string MegatronReader::deepspeed_moe_arg() const {
  for (const char* arg : kDeepSpeedMoeArgs) {
    if (has(arg)) return arg;
  }
  for (const char* arg : kDeepSpeedMoeFlags) {
    if (flag(arg)) return arg;
  }
  if (num_experts_.size() > 1) return "--num-experts";
  if (flag("--deepspeed") && has("--num-experts")) return "--deepspeed";
  return "";
}

void MegatronReader::map_deepspeed_moe(const std::string& marker,
                                       const std::vector<const char*>& core_args) {
  for (const char* arg : core_args) {
    if (has(arg) || flag(arg)) {
      fail(arg, "is Megatron-Core's MoE argument, and " + marker +
                    " Megatron-DeepSpeed's: a launch line configures its experts with one of "
                    "them");
    }
  }
  if (has("--num-experts-switch")) {
    fail("--num-experts-switch",
         "Megatron-DeepSpeed's SwitchMLP is not modelled; give --num-experts (DeepSpeed's MoE)");
  }
  if (flag("--enable-expert-tensor-parallelism")) {
    // The experts split over the model's tensor-parallel ranks.
    set("parallelism.etp",
        has("--tensor-model-parallel-size") ? integer("--tensor-model-parallel-size", 1, kDegree)
                                            : 1,
        "--enable-expert-tensor-parallelism");
  }
  set_degree("parallelism.ep", "--moe-expert-parallel-size");
  const std::int64_t experts =
      has("--num-experts") ? integer("--num-experts", 1, 1 << 20) : std::int64_t{1};
  for (const auto& count : num_experts_) {
    if (count != num_experts_.front()) {
      fail("--num-experts",
           "gives MoE layers different expert counts (" + values_.at("--num-experts") + ", " +
               quote_text(count) +
               "; DeepSpeed's PR-MoE pyramid): stratasim's MoE layers have one expert count");
    }
  }
  const std::int64_t interval =
      has("--expert-interval") ? integer("--expert-interval", 1, 100'000) : 2;
  if (num_experts_.size() > 1 && has("--num-layers") &&
      static_cast<std::int64_t>(num_experts_.size()) !=
          integer("--num-layers", 1, 100'000) / interval) {
    fail("--num-experts", "gives " + std::to_string(num_experts_.size()) +
                              " counts; expected one, or one per MoE layer (num_layers / "
                              "expert_interval = " +
                              std::to_string(integer("--num-layers", 1, 100'000) / interval) + ")");
  }
  if (experts <= 1) {
    note(
        "--num-experts 1: a dense model (Megatron-DeepSpeed's default); its MoE arguments "
        "have no effect");
    return;
  }
  set("model.moe.num_experts", experts, "--num-experts");
  set("model.moe.top_k", has("--topk") ? integer("--topk", 1, experts) : 1, "--topk");
  if (const auto ffn = ffn_width()) {
    set("model.moe.ffn_hidden", *ffn,
        has("--ffn-hidden-size") ? "--ffn-hidden-size" : "--hidden-size");
  } else {
    fail("--num-experts", "needs --ffn-hidden-size (or --hidden-size) for the experts' width");
  }
  const auto defaulted = [&](const std::string& path, json value, const std::string& what) {
    out_.overrides.push_back(
        {path, std::move(value), source_ + " (Megatron-DeepSpeed's default " + what + ")"});
  };
  // MoE on layers interval - 1, 2 interval - 1, ... (layer_num % interval == 0, 1-based).
  if (has("--expert-interval")) {
    set("model.moe.first_dense", interval - 1, "--expert-interval");
    set("model.moe.interval", interval, "--expert-interval");
  } else {
    defaulted("model.moe.first_dense", 1, "--expert-interval 2");
    defaulted("model.moe.interval", 2, "--expert-interval 2");
  }
  if (has("--moe-loss-coeff")) {
    set("model.moe.aux_loss_coeff", number("--moe-loss-coeff", 0, 1e6), "--moe-loss-coeff");
  } else {
    defaulted("model.moe.aux_loss_coeff", 0.1, "--moe-loss-coeff 0.1");
  }
  if (flag("--disable-moe-token-dropping")) {
    if (has("--moe-train-capacity-factor")) {
      note("--moe-train-capacity-factor has no effect with --disable-moe-token-dropping");
    }
  } else if (has("--moe-train-capacity-factor")) {
    set("model.moe.capacity_factor", number("--moe-train-capacity-factor", 1e-6, 1e6),
        "--moe-train-capacity-factor");
  } else {
    defaulted("model.moe.capacity_factor", 1.0, "--moe-train-capacity-factor 1.0");
  }
  if (has("--moe-min-capacity")) {
    integer("--moe-min-capacity", 0, std::int64_t{1} << 40);
    note(
        "--moe-min-capacity is not modelled: an expert's capacity is at least it in "
        "DeepSpeed, which matters only when capacity_factor x tokens x topk / experts is "
        "smaller");
  }
  if (has("--mlp-type") && choice("--mlp-type", {"standard", "residual"}) == "residual") {
    set("model.moe.shared_experts", 1, "--mlp-type");
    set("model.moe.shared_expert_gate", true, "--mlp-type");
    note(
        "--mlp-type residual: PR-MoE's residual MLP is modelled as a shared expert of the "
        "experts' width, its mixing coefficient (a Linear hidden -> 2 with bias) as a "
        "shared-expert gate (hidden -> 1: hidden + 2 parameters fewer per MoE layer), split "
        "over tensor parallelism like the dense MLP");
  }
  if (flag("--use-tutel")) {
    note("--use-tutel: Tutel's kernels are not modelled (costed as DeepSpeed's experts)");
  }
  // deepspeed.moe.experts.Experts runs its local experts one after another.
  out_.overrides.push_back({"parallelism.moe_grouped_gemm", false,
                            source_ + " (Megatron-DeepSpeed: DeepSpeed's experts run one GEMM "
                                      "each, not a grouped GEMM)"});
  if (has("--tensor-model-parallel-size") && !flag("--enable-expert-tensor-parallelism")) {
    note(
        "DeepSpeed's expert-parallel groups lie within the data-parallel group, each expert "
        "replicated over the tensor-parallel ranks, which split the tokens between them; "
        "modelled with Megatron-Core's layout (ep x etp ranks carved out of tp x dp), which "
        "holds the same experts and tokens per rank but puts tensor-parallel ranks in an "
        "expert-parallel group");
  }
}

std::optional<std::int64_t> MegatronReader::ffn_width() const {
  constexpr std::int64_t kBig = 1 << 24;
  if (has("--ffn-hidden-size")) return integer("--ffn-hidden-size", 1, kBig);
  if (!has("--hidden-size")) return std::nullopt;
  const std::int64_t hidden = integer("--hidden-size", 1, kBig);
  return flag("--swiglu") ? (4 * hidden * 2 / 3) / 64 * 64 : 4 * hidden;
}

void MegatronReader::map_world(const LaunchLine& launch) {
  if (!launch.prefix.empty()) {
    std::string words;
    for (const auto& w : launch.prefix) words += (words.empty() ? "" : " ") + w;
    note("\"" + words + "\" before " + launch.launchers.front() + " ignored");
  }
  if (!launch.nodes && !launch.per_node && !launch.world) {
    if (!launch.launchers.empty()) {
      note(launch.launchers.back() +
           " gives no number of nodes or GPUs per node: the experiment's cluster is kept");
    }
    return;
  }
  const auto option = [](const LaunchSize& s) { return s.given.substr(0, s.given.find(' ')); };
  std::optional<LaunchSize> nodes = launch.nodes;
  std::optional<LaunchSize> per_node = launch.per_node;
  if (launch.world) {
    const LaunchSize& w = *launch.world;
    const std::string world = std::to_string(w.value);
    if (nodes && per_node) {
      if (nodes->value * per_node->value != w.value) {
        fail(option(w), "starts " + world + " processes, but " + nodes->given + " x " +
                            per_node->given + " are " +
                            std::to_string(nodes->value * per_node->value));
      }
    } else if (nodes || per_node) {
      const LaunchSize& known = nodes ? *nodes : *per_node;
      if (w.value % known.value != 0) {
        fail(option(w), "starts " + world + " processes, not a multiple of " + known.given);
      }
      const LaunchSize other{w.value / known.value, w.given + " / " + known.given};
      (nodes ? per_node : nodes) = other;
    } else {
      fail(option(w), "gives the number of processes (" + world +
                          ") but not how many run on each node, which sizes the cluster: add "
                          "the launcher's processes per node (mpirun -npernode, srun "
                          "--ntasks-per-node, torchrun --nproc_per_node)");
    }
  }
  const std::string launcher = launch.launchers.back();
  std::string size;
  if (nodes) {
    Reader::set("cluster.nodes", nodes->value, launcher + " " + nodes->given);
    size = std::to_string(nodes->value) + " node(s)";
  } else {
    size = "the cluster's nodes";
  }
  if (per_node) {
    Reader::set("cluster.devices_per_node", per_node->value, launcher + " " + per_node->given);
    size += " x " + std::to_string(per_node->value) + " GPU(s)";
  } else {
    size += " x the cluster's GPUs per node";
  }
  // Megatron's data-parallel size is what remains of the world.
  out_.overrides.push_back({"parallelism.dp", nullptr, source_ + " (dp = world / (tp x pp))"});
  note("the cluster is sized by the launch line (" + launcher + "): " + size +
       "; its device and network are the experiment's");
}

void MegatronReader::map_deepspeed_config() {
  if (!has("--deepspeed_config")) return;
  const std::string& file = values_.at("--deepspeed_config");
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    // A pasted launch line names a file on the machine it ran on: say so, read nothing.
    note("--deepspeed_config " + quote_text(file) +
         ": no such file here (the path is relative to the current directory): no DeepSpeed "
         "config read; give it to stratasim's --deepspeed");
    return;
  }
  if (!std::filesystem::is_regular_file(file, ec)) {
    fail("--deepspeed_config", quote_text(file) + ": not a regular file; expected a JSON file");
  }
  ForeignInput ds = load_deepspeed(file);
  out_.overrides.insert(out_.overrides.begin(), ds.overrides.begin(), ds.overrides.end());
  out_.notes.insert(out_.notes.begin(), ds.notes.begin(), ds.notes.end());
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json.

// Keys every PretrainedConfig may carry that do not change the cost of training.
const std::vector<std::string> kHfCommon = {"_name_or_path",
                                            "architectures",
                                            "model_type",
                                            "transformers_version",
                                            "torch_dtype",
                                            "bos_token_id",
                                            "eos_token_id",
                                            "pad_token_id",
                                            "sep_token_id",
                                            "decoder_start_token_id",
                                            "initializer_range",
                                            "use_cache",
                                            "return_dict",
                                            "output_hidden_states",
                                            "output_attentions",
                                            "torchscript",
                                            "chunk_size_feed_forward",
                                            "is_encoder_decoder",
                                            "is_decoder",
                                            "tie_encoder_decoder",
                                            "prune_heads",
                                            "problem_type",
                                            "id2label",
                                            "label2id",
                                            "finetuning_task",
                                            "tokenizer_class",
                                            "prefix",
                                            "task_specific_params",
                                            "max_length",
                                            "min_length",
                                            "do_sample",
                                            "early_stopping",
                                            "num_beams",
                                            "temperature",
                                            "top_k",
                                            "top_p",
                                            "repetition_penalty",
                                            "length_penalty",
                                            "no_repeat_ngram_size",
                                            "bad_words_ids",
                                            "num_return_sequences",
                                            "auto_map",
                                            "use_return_dict",
                                            "attention_dropout",
                                            "hidden_dropout",
                                            "hidden_dropout_prob",
                                            "attention_probs_dropout_prob",
                                            "rope_theta",
                                            "rope_scaling",
                                            "rope_parameters",
                                            "pretraining_tp",
                                            "quantization_config"};

// The keys read (or accepted) of each family's config.json: GPT-2 (GPT2Config).
const std::vector<std::string> kHfGpt2Keys = {"n_embd",
                                              "n_layer",
                                              "n_head",
                                              "n_inner",
                                              "vocab_size",
                                              "n_positions",
                                              "n_ctx",
                                              "activation_function",
                                              "layer_norm_epsilon",
                                              "tie_word_embeddings",
                                              "attn_pdrop",
                                              "embd_pdrop",
                                              "resid_pdrop",
                                              "summary_type",
                                              "summary_use_proj",
                                              "summary_activation",
                                              "summary_proj_to_labels",
                                              "summary_first_dropout",
                                              "scale_attn_weights",
                                              "scale_attn_by_inverse_layer_idx",
                                              "reorder_and_upcast_attn",
                                              "add_cross_attention"};
// GPT-NeoX (GPTNeoXConfig).
const std::vector<std::string> kHfNeoxKeys = {"hidden_size",
                                              "intermediate_size",
                                              "num_hidden_layers",
                                              "num_attention_heads",
                                              "vocab_size",
                                              "max_position_embeddings",
                                              "hidden_act",
                                              "rotary_pct",
                                              "rotary_emb_base",
                                              "layer_norm_eps",
                                              "use_parallel_residual",
                                              "tie_word_embeddings",
                                              "attention_bias",
                                              "classifier_dropout"};
// BERT (BertConfig).
const std::vector<std::string> kHfBertKeys = {"hidden_size",
                                              "intermediate_size",
                                              "num_hidden_layers",
                                              "num_attention_heads",
                                              "vocab_size",
                                              "max_position_embeddings",
                                              "hidden_act",
                                              "layer_norm_eps",
                                              "type_vocab_size",
                                              "position_embedding_type",
                                              "tie_word_embeddings",
                                              "classifier_dropout",
                                              "gradient_checkpointing"};
// DeepSeek-V2 / V3.
const std::vector<std::string> kHfDeepSeekKeys = {"hidden_size",
                                                  "intermediate_size",
                                                  "moe_intermediate_size",
                                                  "num_hidden_layers",
                                                  "num_attention_heads",
                                                  "num_key_value_heads",
                                                  "n_shared_experts",
                                                  "n_routed_experts",
                                                  "routed_scaling_factor",
                                                  "kv_lora_rank",
                                                  "q_lora_rank",
                                                  "qk_rope_head_dim",
                                                  "v_head_dim",
                                                  "qk_nope_head_dim",
                                                  "topk_method",
                                                  "n_group",
                                                  "topk_group",
                                                  "num_experts_per_tok",
                                                  "moe_layer_freq",
                                                  "first_k_dense_replace",
                                                  "norm_topk_prob",
                                                  "scoring_func",
                                                  "aux_loss_alpha",
                                                  "seq_aux",
                                                  "hidden_act",
                                                  "max_position_embeddings",
                                                  "rms_norm_eps",
                                                  "tie_word_embeddings",
                                                  "attention_bias",
                                                  "vocab_size",
                                                  "ep_size",
                                                  "num_nextn_predict_layers"};
// The Llama-shaped families (HfReader::read_llama), Mixtral's and Qwen's experts included.
const std::vector<std::string> kHfLlamaKeys = {"num_local_experts",
                                               "num_experts",
                                               "moe_intermediate_size",
                                               "shared_expert_intermediate_size",
                                               "decoder_sparse_step",
                                               "mlp_only_layers",
                                               "norm_topk_prob",
                                               "num_experts_per_tok",
                                               "router_aux_loss_coef",
                                               "output_router_logits",
                                               "router_jitter_noise",
                                               "hidden_size",
                                               "intermediate_size",
                                               "num_hidden_layers",
                                               "num_attention_heads",
                                               "num_key_value_heads",
                                               "vocab_size",
                                               "max_position_embeddings",
                                               "hidden_act",
                                               "rms_norm_eps",
                                               "tie_word_embeddings",
                                               "attention_bias",
                                               "mlp_bias",
                                               "head_dim",
                                               "sliding_window",
                                               "max_window_layers",
                                               "use_sliding_window",
                                               "hidden_activation",
                                               "layer_types",
                                               "sliding_window_pattern",
                                               "query_pre_attn_scalar",
                                               "attn_logit_softcapping",
                                               "final_logit_softcapping",
                                               "cache_implementation",
                                               "rope_local_base_freq",
                                               "original_max_position_embeddings",
                                               "partial_rotary_factor",
                                               "norm_eps",
                                               "layer_norm_eps",
                                               "resid_pdrop",
                                               "embd_pdrop",
                                               "attn_implementation"};
// Llama 4's text model, besides kHfLlamaKeys.
const std::vector<std::string> kHfLlama4Keys = {"intermediate_size_mlp",
                                                "interleave_moe_layer_step",
                                                "moe_layers",
                                                "no_rope_layers",
                                                "no_rope_layer_interval",
                                                "attention_chunk_size",
                                                "use_qk_norm",
                                                "attn_temperature_tuning",
                                                "floor_scale",
                                                "attn_scale",
                                                "for_llm_compressor"};

class HfReader {
 public:
  HfReader(config::Document& doc, std::string path, std::vector<std::string>& notes,
           const std::string& fallback_source);

  void convert();

 private:
  // The model's name and source: the file's stem, else _name_or_path, else the model type.
  void name_model(json& m, const std::string& type);
  // `m`'s fields from the config.json of a `type` model; returns the keys the family reads
  // or accepts.
  std::vector<std::string> read_family(json& m, const std::string& type);
  // Notes on torch_dtype and quantization_config: the stored weights, not the training.
  void note_stored_types();
  // A note for each key of `object` not `known`, with the closest known one.
  void note_unread_keys(const json& object, const std::vector<std::string>& known);
  // TransformerModel::validate over `m`, its errors naming the config.json's keys.
  void check_shape(const json& m);

  void note(const std::string& text) { notes_.push_back(source_ + ": " + text); }

  std::string model_type(const json& object);

  std::int64_t integer(const char* key, const char* ours, std::int64_t hi = 1 << 24) {
    hf_key_[ours] = key;
    return r_.integer_in(key, 1, hi);
  }
  std::int64_t integer_or(const char* key, const char* ours, std::int64_t fallback,
                          std::int64_t hi = 1 << 24) {
    hf_key_[ours] = key;
    return r_.integer_in_or(key, 1, hi, fallback);
  }

  // The Llama-shaped families: decoder, rotary positions, no position table. What differs
  // (Hugging Face's modeling_*.py): Qwen2's biases on Q, K and V only; Qwen3's and Gemma 3's
  // per-head q/k RMSNorm; Gemma's GeGLU, head_dim 256, tied embeddings and (2, 3) the extra
  // norms after each block; Gemma 2's soft-capping; Nemotron's squared-ReLU MLP (not gated)
  // and LayerNorm; the sliding windows of Mistral, Phi-3 and Gemma 2/3.
  void read_llama(json& m, const std::string& type);

  // Qwen's mixture of experts (modeling_qwen2_moe.py, modeling_qwen3_moe.py): num_experts
  // routed experts of moe_intermediate_size, top num_experts_per_tok; Qwen2-MoE adds one shared
  // expert of shared_expert_intermediate_size behind a sigmoid gate. Every layer is an MoE layer
  // with decoder_sparse_step 1 and no mlp_only_layers; other layouts are errors.
  void read_qwen_moe(json& m, const std::string& type);

  // The MLP: gated (SwiGLU, GeGLU) in every family but Nemotron's squared ReLU.
  void read_activation(json& m, const std::string& type);

  // Sliding-window attention: Mistral's and Phi-3's on every layer; Qwen2's only past
  // max_window_layers with use_sliding_window (not modelled: an error when on); Gemma 2's on
  // every other layer, Gemma 3's on five of every six (sliding_window_pattern, or the newer
  // layer_types list).
  void read_window(json& m, const std::string& type);

  // The period n of a layer_types list (`local` -- Gemma 3's "sliding_attention", Llama 4's
  // "chunked_attention" -- or "full_attention") whose global layers are exactly n - 1, 2n - 1,
  // ...; `fallback` when there is no list.
  int global_every_of_layer_types(int layers, int fallback,
                                  const std::string& local = "sliding_attention");

  // Llama 4's multimodal config.json (model_type llama4, Llama4Config): the text model is its
  // text_config (model_type llama4_text), read as a config.json of its own (errors name
  // text_config's keys) and put in the place of the whole; the vision encoder and the
  // multimodal projector are not modelled (the text model is what trains).
  void convert_llama4();

  // Llama 4's text model (modeling_llama4.py, Llama4TextConfig):
  // - MoE layers (moe_layers, or every interleave_moe_layer_step-th: layers step - 1, 2 step -
  //   1, ...): num_local_experts routed experts of intermediate_size, num_experts_per_tok per
  //   token, plus one shared expert of intermediate_size every token goes through; the other
  //   layers' dense MLP is intermediate_size_mlp wide;
  // - NoPE layers (no_rope_layers 0, by default every no_rope_layer_interval-th: layers 3, 7,
  //   ...) attend globally without RoPE; the RoPE layers within chunks of attention_chunk_size
  //   tokens (layer_types "chunked_attention" / "full_attention" when given);
  // - use_qk_norm: a weightless L2 norm of q and k on the RoPE layers.
  void read_llama4(json& m);

  // Every how many layers a NoPE layer comes (0: none), from no_rope_layers (1: RoPE, 0: NoPE;
  // at least one per layer) or no_rope_layer_interval (default 4).
  int nope_period(int layers);

  // Llama 4's MoE layers as (first, interval): moe_layers when given (evenly spaced up to the
  // last layer; empty: none), else every interleave_moe_layer_step-th layer from step - 1.
  // interval 0: no MoE layer.
  std::pair<int, int> llama4_moe_layers(int layers);

  // DeepSeek-V2 / V3 (modeling_deepseek.py): MLA attention, first_k_dense_replace dense layers,
  // n_routed_experts of moe_intermediate_size (num_experts_per_tok per token) and
  // n_shared_experts; V3's sigmoid scoring with group-limited routing (topk_method noaux_tc).
  void read_deepseek(json& m, const std::string& type);

  void read_gpt2(json& m);

  // The shape GPT-NeoX and BERT write alike: hidden_size, intermediate_size,
  // num_hidden_layers, num_attention_heads (every head its own K and V), vocab_size,
  // max_position_embeddings (`max_seq_len` when absent); hidden_act, modelled as GELU.
  void read_mha_shape(json& m, std::int64_t max_seq_len);

  void read_neox(json& m);

  // BERT (transformers' modeling_bert.py): an encoder (no causal mask) with learned positions,
  // LayerNorm, GELU and biases, the masked-LM head tied to the word embeddings, as
  // configs/models/bert-large.json. The token-type embeddings (type_vocab_size x hidden) and the
  // MLM head's transform are not costed, as there.
  void read_bert(json& m);

  // Dropout probabilities under each family's names (and BERT's), with the family's defaults:
  // GPT-2 0.1 (resid_pdrop, attn_pdrop), GPT-NeoX 0 (hidden_dropout, attention_dropout), Llama
  // and Mistral 0 (attention_dropout; no hidden dropout).
  void read_dropout(json& m, const std::string& type);

  void gelu_note(const char* key, const std::string& act) {
    if (act.rfind("gelu", 0) != 0) {
      note(std::string(key) + " " + quote_text(act) +
           " is modelled as GELU (the same GEMMs, an elementwise function of the same size)");
    }
  }

  config::Document& doc_;
  std::string path_;
  std::vector<std::string>& notes_;
  config::ObjectReader r_;
  std::string source_;
  std::map<std::string, std::string> hf_key_;  // our model key -> the config.json's
};

HfReader::HfReader(config::Document& doc, std::string path, std::vector<std::string>& notes,
                   const std::string& fallback_source)
    : doc_(doc),
      path_(std::move(path)),
      notes_(notes),
      r_(doc, path_, "a Hugging Face config.json") {
  const auto file = doc.file_of(path_);
  source_ = file.empty() ? fallback_source : file.string();
}

void HfReader::convert() {
  const json& object = *doc_.find(path_);
  const std::string type = model_type(object);
  if (type == "llama4") {
    convert_llama4();
    return;
  }
  json m = json::object();
  m["type"] = "transformer";
  name_model(m, type);
  std::vector<std::string> known = read_family(m, type);
  read_dropout(m, type);
  note_stored_types();
  known.insert(known.end(), kHfCommon.begin(), kHfCommon.end());
  note_unread_keys(object, known);
  check_shape(m);
  doc_.set(path_, std::move(m), source_ + " (read as a stratasim model)");
}

void HfReader::name_model(json& m, const std::string& type) {
  const auto file = doc_.file_of(path_);
  std::string name = r_.string_or("_name_or_path", "");
  if (!file.empty()) name = file.stem().string();
  if (name.empty()) name = type;
  m["name"] = name;
  m["source"] = "Hugging Face config.json (model_type " + type + ")" +
                (file.empty() ? std::string() : ": " + file.string());
}

std::vector<std::string> HfReader::read_family(json& m, const std::string& type) {
  if (type == "gpt2") {
    read_gpt2(m);
    return kHfGpt2Keys;
  }
  if (type == "gpt_neox") {
    read_neox(m);
    return kHfNeoxKeys;
  }
  if (type == "bert") {
    read_bert(m);
    return kHfBertKeys;
  }
  if (type == "deepseek_v2" || type == "deepseek_v3") {
    read_deepseek(m, type);
    return kHfDeepSeekKeys;
  }
  // llama, mistral, mixtral, qwen2(_moe), qwen3(_moe), gemma*, phi3, nemotron
  if (type == "gemma3") {
    r_.fail("text_config",
            "a multimodal Gemma 3 config.json: give its text_config object as the model "
            "(model_type gemma3_text); the vision tower is not modelled");
  }
  std::vector<std::string> known = kHfLlamaKeys;
  if (type == "llama4_text") known.insert(known.end(), kHfLlama4Keys.begin(), kHfLlama4Keys.end());
  read_llama(m, type);
  if (type == "llama4_text") read_llama4(m);
  if (type == "mixtral") {
    json moe = json::object();
    moe["num_experts"] = integer("num_local_experts", "moe.num_experts", 1 << 20);
    moe["top_k"] = integer("num_experts_per_tok", "moe.top_k", 1 << 20);
    moe["ffn_hidden"] = m["ffn_hidden"];
    moe["aux_loss_coeff"] = r_.number_or("router_aux_loss_coef", 0.001);
    r_.has("output_router_logits");
    r_.has("router_jitter_noise");
    m["moe"] = std::move(moe);
  }
  if (type == "qwen2_moe" || type == "qwen3_moe") read_qwen_moe(m, type);
  return known;
}

void HfReader::note_stored_types() {
  if (const auto* dtype = doc_.find(config::join_path(path_, "torch_dtype"));
      dtype != nullptr && dtype->is_string()) {
    note("torch_dtype " + shown(*dtype) +
         " is the stored weights' type; training.dtype sets the simulated one");
  }
  if (const auto* q = doc_.find(config::join_path(path_, "quantization_config"));
      q != nullptr && !q->is_null()) {
    note("quantization_config is not modelled (weights train in training.dtype)");
  }
}

void HfReader::note_unread_keys(const json& object, const std::vector<std::string>& known) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const std::string hint = suggestion(key, known);
    note("key '" + key + "' is not read (not modelled)" +
         (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
  }
}

// Shapes checked here so that errors name the config.json's keys.
void HfReader::check_shape(const json& m) {
  TransformerModel model;
  model.layers = m["layers"].get<int>();
  model.hidden = m["hidden"].get<int>();
  model.heads = m["heads"].get<int>();
  model.kv_heads = m["kv_heads"].get<int>();
  model.ffn_hidden = m["ffn_hidden"].get<int>();
  model.vocab = m["vocab"].get<int>();
  model.max_seq_len = m["max_seq_len"].get<int>();
  if (m.contains("head_dim")) model.explicit_head_dim = m["head_dim"].get<int>();
  try {
    model.validate();
  } catch (const config::ValidationError& e) {
    const auto it = hf_key_.find(e.path());
    doc_.fail(config::join_path(path_, it == hf_key_.end() ? e.path() : it->second), e.what());
  }
}

std::string HfReader::model_type(const json& object) {
  std::string list;
  for (auto t : kHfModelTypes) list += (list.empty() ? "" : ", ") + std::string(t);
  if (r_.has("model_type")) {
    const auto* v = doc_.find(r_.path_of("model_type"));
    if (v != nullptr && !v->is_null()) {
      const std::string type = r_.string("model_type");
      for (auto t : kHfModelTypes) {
        if (type == t) return type;
      }
      const std::string hint = suggestion(
          type, std::vector<std::string>(std::begin(kHfModelTypes), std::end(kHfModelTypes)));
      r_.fail("model_type", "model_type " + quote_text(type) + " is not supported; supported: " +
                                list + (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    }
  }
  // Only "architectures": the class names of the supported families.
  static const std::vector<std::pair<std::string, std::string>> kClasses = {
      {"LlamaForCausalLM", "llama"},
      {"MistralForCausalLM", "mistral"},
      {"MixtralForCausalLM", "mixtral"},
      {"DeepseekV2ForCausalLM", "deepseek_v2"},
      {"DeepseekV3ForCausalLM", "deepseek_v3"},
      {"GPT2LMHeadModel", "gpt2"},
      {"GPT2Model", "gpt2"},
      {"GPTNeoXForCausalLM", "gpt_neox"},
      {"BertForMaskedLM", "bert"},
      {"BertForPreTraining", "bert"},
      {"BertModel", "bert"},
      {"Qwen2ForCausalLM", "qwen2"},
      {"Qwen3ForCausalLM", "qwen3"},
      {"Qwen2MoeForCausalLM", "qwen2_moe"},
      {"Qwen3MoeForCausalLM", "qwen3_moe"},
      {"GemmaForCausalLM", "gemma"},
      {"Gemma2ForCausalLM", "gemma2"},
      {"Gemma3ForCausalLM", "gemma3_text"},
      {"Phi3ForCausalLM", "phi3"},
      {"NemotronForCausalLM", "nemotron"},
      {"Llama4ForConditionalGeneration", "llama4"},
      {"Llama4ForCausalLM", "llama4_text"}};
  auto it = object.find("architectures");
  if (it != object.end() && it->is_array()) {
    for (const auto& a : *it) {
      for (const auto& [cls, type] : kClasses) {
        if (a.is_string() && a == cls) return type;
      }
    }
  }
  r_.fail(it != object.end() ? "architectures" : "model_type",
          "names no supported model; model_type must be one of " + list);
}

void HfReader::read_llama(json& m, const std::string& type) {
  const bool gemma = type.rfind("gemma", 0) == 0;
  m["hidden"] = integer("hidden_size", "hidden");
  m["ffn_hidden"] = integer("intermediate_size", "ffn_hidden");
  m["layers"] = integer("num_hidden_layers", "layers", 100'000);
  m["heads"] = integer("num_attention_heads", "heads");
  m["kv_heads"] = integer_or("num_key_value_heads", "kv_heads", m["heads"].get<std::int64_t>());
  m["vocab"] = integer("vocab_size", "vocab", 1 << 30);
  m["max_seq_len"] = integer_or("max_position_embeddings", "max_seq_len", 2048);
  read_activation(m, type);
  m["tied_embeddings"] = r_.boolean_or("tie_word_embeddings", gemma);
  m["position_embedding"] = "rotary";
  m["norm"] = type == "nemotron" ? "layernorm" : "rmsnorm";
  const bool attention_bias = r_.boolean_or("attention_bias", false);
  const bool mlp_bias = r_.boolean_or("mlp_bias", type == "llama" ? attention_bias : false);
  if (type == "qwen2" || type == "qwen2_moe") {
    m["bias"] = false;  // Qwen2Attention: q, k and v with biases, o_proj and the MLP without
    m["qkv_bias"] = true;
  } else {
    if (mlp_bias != attention_bias) {
      note(
          "attention_bias and mlp_bias differ: stratasim gives every linear layer a bias or "
          "none; modelled with attention_bias");
    }
    m["bias"] = attention_bias;
  }
  m["causal"] = true;
  if (type == "qwen3" || type == "qwen3_moe" || type == "gemma3_text") m["qk_norm"] = true;
  if (type == "gemma2" || type == "gemma3_text") m["post_norm"] = true;
  if (gemma) {
    note(
        "the embedding output's scaling by sqrt(hidden_size) is not costed (one elementwise "
        "pass over the embeddings)");
  }
  if (r_.has("head_dim")) {
    const auto* v = doc_.find(r_.path_of("head_dim"));
    if (v != nullptr && !v->is_null()) {
      const auto head_dim = r_.integer_in("head_dim", 1, 1 << 20);
      hf_key_["head_dim"] = "head_dim";
      if (head_dim * m["heads"].get<std::int64_t>() != m["hidden"].get<std::int64_t>()) {
        m["head_dim"] = head_dim;
      }
    }
  }
  read_window(m, type);
  for (const auto& [key, ours] :
       {std::pair<const char*, const char*>{"final_logit_softcapping", "final_softcap"},
        {"attn_logit_softcapping", "attention_softcap"}}) {
    const auto* v = doc_.find(r_.path_of(key));
    r_.has(key);
    if (v == nullptr || v->is_null()) continue;
    const double cap = r_.number(key);
    if (!(cap > 0)) r_.fail(key, "expected a positive cap, or null for none");
    hf_key_[ours] = key;
    m[ours] = cap;
  }
  for (const char* key :
       {"use_sliding_window", "max_window_layers", "query_pre_attn_scalar", "cache_implementation",
        "rope_local_base_freq", "original_max_position_embeddings", "partial_rotary_factor",
        "attn_implementation"}) {
    r_.has(key);
  }
}

void HfReader::read_qwen_moe(json& m, const std::string& type) {
  json moe = json::object();
  moe["num_experts"] = integer("num_experts", "moe.num_experts", 1 << 20);
  moe["top_k"] = integer("num_experts_per_tok", "moe.top_k", 1 << 20);
  moe["ffn_hidden"] = integer("moe_intermediate_size", "moe.ffn_hidden");
  moe["aux_loss_coeff"] = r_.number_or("router_aux_loss_coef", 0.001);
  if (type == "qwen2_moe") {
    const auto shared = r_.integer_in_or("shared_expert_intermediate_size", 0, 1 << 24, 0);
    if (shared > 0) {
      moe["shared_experts"] = 1;
      moe["shared_ffn_hidden"] = shared;
      moe["shared_expert_gate"] = true;
    }
  }
  if (r_.integer_in_or("decoder_sparse_step", 1, 1 << 20, 1) != 1) {
    r_.fail("decoder_sparse_step",
            "only 1 (every layer an MoE layer) is modelled for Qwen's MoE models");
  }
  if (const auto* only = doc_.find(r_.path_of("mlp_only_layers"));
      only != nullptr && !only->is_null() && !(only->is_array() && only->empty())) {
    r_.fail("mlp_only_layers", "dense layers among Qwen's MoE layers are not modelled");
  }
  r_.has("mlp_only_layers");
  r_.has("norm_topk_prob");
  r_.has("output_router_logits");
  m["moe"] = std::move(moe);
}

void HfReader::read_activation(json& m, const std::string& type) {
  const bool gemma = type.rfind("gemma", 0) == 0;
  // Gemma's hidden_activation (newer files) overrides hidden_act.
  const char* key = gemma && r_.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string act = r_.string_or(key, type == "nemotron" ? "relu2"
                                            : gemma            ? "gelu_pytorch_tanh"
                                                               : "silu");
  if (type == "nemotron") {
    if (act != "relu2") {
      r_.fail(key,
              "Nemotron's MLP is modelled with its squared ReLU (relu2), got " + quote_text(act));
    }
    m["activation"] = "squared_relu";
    return;
  }
  if (act.rfind("gelu", 0) == 0) {
    m["activation"] = "geglu";  // gate, up and down projections, GELU on the gate
    return;
  }
  if (act != "silu" && act != "swish") {
    note(std::string(key) + " " + quote_text(act) +
         " in the gated MLP is modelled as SwiGLU (the same three GEMMs)");
  }
  m["activation"] = "swiglu";
}

void HfReader::read_window(json& m, const std::string& type) {
  const auto* v = doc_.find(r_.path_of("sliding_window"));
  r_.has("sliding_window");
  if (v == nullptr || v->is_null()) return;
  const auto window = r_.integer_in("sliding_window", 1, std::int64_t{1} << 40);
  if (type.rfind("qwen", 0) == 0) {
    if (r_.boolean_or("use_sliding_window", false)) {
      r_.fail("use_sliding_window",
              "Qwen's sliding window on the layers past max_window_layers is not modelled "
              "(only every layer, or all but every n-th)");
    }
    return;  // the window is off
  }
  if (type != "mistral" && type != "mixtral" && type != "phi3" && type != "gemma2" &&
      type != "gemma3_text") {
    note("sliding_window " + std::to_string(window) + " is not used by model_type " + type);
    return;
  }
  hf_key_["sliding_window"] = "sliding_window";
  m["sliding_window"] = window;
  if (type == "gemma2") {
    m["global_attention_every"] = 2;  // even layers local, odd ones global
  } else if (type == "gemma3_text") {
    m["global_attention_every"] = global_every_of_layer_types(
        static_cast<int>(m["layers"].get<std::int64_t>()),
        static_cast<int>(r_.integer_in_or("sliding_window_pattern", 1, 1 << 20, 6)));
  }
}

int HfReader::global_every_of_layer_types(int layers, int fallback, const std::string& local) {
  const auto* list = doc_.find(r_.path_of("layer_types"));
  r_.has("layer_types");
  if (list == nullptr || list->is_null()) return fallback;
  const auto fail = [&](const std::string& why) { doc_.fail(r_.path_of("layer_types"), why); };
  const std::string choices = "\"" + local + "\" or \"full_attention\"";
  if (!list->is_array() || static_cast<int>(list->size()) != layers) {
    fail("expected one of " + choices + " per layer (" + std::to_string(layers) + ")");
  }
  int period = 0;
  for (int i = 0; i < layers; ++i) {
    const auto& t = (*list)[static_cast<std::size_t>(i)];
    if (!t.is_string() || (t != local && t != "full_attention")) {
      fail("[" + std::to_string(i) + "]: expected " + choices);
    }
    if (t == "full_attention" && period == 0) period = i + 1;
  }
  if (period == 0) return 0;  // every layer local
  for (int i = 0; i < layers; ++i) {
    const bool global = (i + 1) % period == 0;
    if (global != ((*list)[static_cast<std::size_t>(i)] == "full_attention")) {
      fail("is not every " + std::to_string(period) +
           "-th layer global: only that pattern (or all layers local) is modelled");
    }
  }
  return period;
}

void HfReader::convert_llama4() {
  const std::string text = config::join_path(path_, "text_config");
  const json* t = doc_.find(text);
  r_.has("text_config");
  if (t == nullptr || !t->is_object()) {
    r_.fail("text_config",
            "expected the text model's config (an object, model_type llama4_text): Llama 4's "
            "text model is what stratasim trains");
  }
  if (!t->contains("model_type")) {
    json with_type = *t;
    with_type["model_type"] = "llama4_text";
    doc_.set(text, std::move(with_type), source_ + " (text_config of model_type llama4)");
  }
  if (const auto* v = doc_.find(r_.path_of("vision_config")); v != nullptr && !v->is_null()) {
    note(
        "vision_config: the vision encoder and the multimodal projector are not modelled; "
        "the text model (text_config) is trained on text tokens");
  }
  HfReader(doc_, text, notes_, source_).convert();
  json model = *doc_.find(text);
  const auto file = doc_.file_of(path_);
  model["source"] = "Hugging Face config.json (model_type llama4, its text_config)" +
                    (file.empty() ? std::string() : ": " + file.string());
  doc_.set(path_, std::move(model), source_ + " (text_config read as a stratasim model)");
}

void HfReader::read_llama4(json& m) {
  const int layers = static_cast<int>(m["layers"].get<std::int64_t>());
  m["ffn_hidden"] = integer_or("intermediate_size_mlp", "ffn_hidden", 16384);
  // Attention: chunked on the RoPE layers, global on the NoPE ones.
  const int nope_every = nope_period(layers);
  const auto* chunk = doc_.find(r_.path_of("attention_chunk_size"));
  r_.has("attention_chunk_size");
  if (chunk == nullptr || !chunk->is_null()) {  // Llama4TextConfig's default: 8192
    hf_key_["attention_chunk"] = "attention_chunk_size";
    m["attention_chunk"] = r_.integer_in_or("attention_chunk_size", 1, std::int64_t{1} << 40, 8192);
    const int period = global_every_of_layer_types(layers, nope_every, "chunked_attention");
    if (period > 0) {
      hf_key_["global_attention_every"] = "layer_types";
      m["global_attention_every"] = period;
    }
  }
  if (r_.boolean_or("use_qk_norm", true)) {
    m["qk_norm"] = true;
    m["qk_norm_l2"] = true;
    if (nope_every > 0) {
      note(
          "use_qk_norm: the L2 norm of q and k (no weights) runs on the RoPE layers only; "
          "costed on every layer (one elementwise pass over q and k on the NoPE layers too)");
    }
  }
  if (nope_every > 0 && r_.boolean_or("attn_temperature_tuning", true)) {
    note(
        "attn_temperature_tuning: the NoPE layers' scaling of the queries by position is not "
        "costed (one elementwise pass over the queries)");
  }
  for (const char* key : {"floor_scale", "attn_scale", "for_llm_compressor", "router_jitter_noise",
                          "output_router_logits"}) {
    r_.has(key);
  }
  // Mixture of experts.
  const auto [first, interval] = llama4_moe_layers(layers);
  if (interval == 0) return;  // no MoE layer: a dense model
  json moe = json::object();
  moe["num_experts"] = integer_or("num_local_experts", "moe.num_experts", 16, 1 << 20);
  moe["top_k"] = integer_or("num_experts_per_tok", "moe.top_k", 1, 1 << 20);
  moe["ffn_hidden"] = integer("intermediate_size", "moe.ffn_hidden");
  moe["shared_experts"] = 1;  // Llama4TextMoe's shared_expert, of intermediate_size
  moe["first_dense"] = first;
  moe["interval"] = interval;
  moe["aux_loss_coeff"] = r_.number_or("router_aux_loss_coef", 0.001);
  note(
      "Llama 4's router (a sigmoid of the top-k logits, scaling the experts' inputs) is costed "
      "as softmax_topk: the same Linear hidden -> num_local_experts and top-k");
  m["moe"] = std::move(moe);
}

int HfReader::nope_period(int layers) {
  const auto* list = doc_.find(r_.path_of("no_rope_layers"));
  r_.has("no_rope_layers");
  if (list == nullptr || list->is_null() || (list->is_array() && list->empty())) {
    const auto n = r_.integer_in_or("no_rope_layer_interval", 1, 1 << 20, 4);
    return n > layers ? 0 : static_cast<int>(n);  // no NoPE layer among the model's
  }
  r_.has("no_rope_layer_interval");
  const auto fail = [&](const std::string& why) { doc_.fail(r_.path_of("no_rope_layers"), why); };
  if (!list->is_array() || static_cast<int>(list->size()) < layers) {
    fail("expected 1 (RoPE) or 0 (NoPE) for each of the " + std::to_string(layers) + " layers");
  }
  int period = 0;
  for (int i = 0; i < layers; ++i) {
    const auto& v = (*list)[static_cast<std::size_t>(i)];
    if (!v.is_number_integer() || (v != 0 && v != 1)) {
      fail("[" + std::to_string(i) + "]: expected 1 (RoPE) or 0 (NoPE)");
    }
    if (v == 0 && period == 0) period = i + 1;
  }
  for (int i = 0; period > 0 && i < layers; ++i) {
    const bool nope = (i + 1) % period == 0;
    if (nope != ((*list)[static_cast<std::size_t>(i)] == 0)) {
      fail("is not a NoPE layer every " + std::to_string(period) +
           " layers: only that pattern (or no NoPE layer) is modelled");
    }
  }
  return period;
}

std::pair<int, int> HfReader::llama4_moe_layers(int layers) {
  const auto* list = doc_.find(r_.path_of("moe_layers"));
  r_.has("moe_layers");
  const auto step = r_.integer_in_or("interleave_moe_layer_step", 1, 1 << 20, 1);
  if (list == nullptr || list->is_null()) {
    if (step > layers) return {0, 0};
    hf_key_["moe.interval"] = "interleave_moe_layer_step";
    return {static_cast<int>(step) - 1, static_cast<int>(step)};
  }
  const auto fail = [&](const std::string& why) { doc_.fail(r_.path_of("moe_layers"), why); };
  if (!list->is_array()) fail("expected a list of layer indices");
  if (list->empty()) return {0, 0};
  std::vector<int> ids;
  for (const auto& v : *list) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= layers) {
      fail("expected layer indices from 0 to " + std::to_string(layers - 1) + ", got " + shown(v));
    }
    ids.push_back(v.get<int>());
  }
  const int first = ids.front();
  const int interval = ids.size() > 1 ? ids[1] - ids[0] : layers;
  std::vector<int> expected;
  for (int l = first; interval > 0 && l < layers; l += interval) expected.push_back(l);
  if (interval <= 0 || ids != expected) {
    fail(
        "only evenly spaced MoE layers running to the last layers (first, first + n, ...) "
        "are modelled");
  }
  return {first, interval};
}

void HfReader::read_deepseek(json& m, const std::string& type) {
  m["hidden"] = integer("hidden_size", "hidden");
  m["ffn_hidden"] = integer("intermediate_size", "ffn_hidden");
  m["layers"] = integer("num_hidden_layers", "layers", 100'000);
  m["heads"] = integer("num_attention_heads", "heads");
  m["kv_heads"] = m["heads"];  // MLA: every head has its keys and values
  r_.has("num_key_value_heads");
  m["vocab"] = integer("vocab_size", "vocab", 1 << 30);
  m["max_seq_len"] = integer_or("max_position_embeddings", "max_seq_len", 4096);
  m["activation"] = "swiglu";
  m["tied_embeddings"] = r_.boolean_or("tie_word_embeddings", false);
  m["position_embedding"] = "rotary";
  m["norm"] = "rmsnorm";
  m["bias"] = r_.boolean_or("attention_bias", false);
  m["causal"] = true;
  r_.string_or("hidden_act", "silu");
  json mla = json::object();
  const auto* q_lora = doc_.find(r_.path_of("q_lora_rank"));
  r_.has("q_lora_rank");
  if (q_lora != nullptr && !q_lora->is_null()) {
    mla["q_lora_rank"] = integer("q_lora_rank", "mla.q_lora_rank", 1 << 20);
  }
  mla["kv_lora_rank"] = integer("kv_lora_rank", "mla.kv_lora_rank", 1 << 20);
  mla["qk_nope_head_dim"] = integer("qk_nope_head_dim", "mla.qk_nope_head_dim", 1 << 20);
  mla["qk_rope_head_dim"] = integer("qk_rope_head_dim", "mla.qk_rope_head_dim", 1 << 20);
  mla["v_head_dim"] = integer("v_head_dim", "mla.v_head_dim", 1 << 20);
  m["mla"] = std::move(mla);
  const auto* routed = doc_.find(r_.path_of("n_routed_experts"));
  r_.has("n_routed_experts");
  if (routed == nullptr || routed->is_null()) return;  // a dense DeepSeek
  json moe = json::object();
  moe["num_experts"] = integer("n_routed_experts", "moe.num_experts", 1 << 20);
  moe["top_k"] = integer("num_experts_per_tok", "moe.top_k", 1 << 20);
  moe["ffn_hidden"] = integer("moe_intermediate_size", "moe.ffn_hidden");
  const auto* shared = doc_.find(r_.path_of("n_shared_experts"));
  r_.has("n_shared_experts");
  if (shared != nullptr && !shared->is_null()) {
    moe["shared_experts"] = r_.integer_in("n_shared_experts", 0, 1 << 10);
  }
  moe["first_dense"] = r_.integer_in_or("first_k_dense_replace", 0, 100'000, 0);
  moe["interval"] = integer_or("moe_layer_freq", "moe.interval", 1);
  const std::string method = r_.string_or("topk_method", "greedy");
  const std::string scoring = r_.string_or("scoring_func", "softmax");
  if (scoring == "sigmoid" || method == "noaux_tc" || method == "group_limited_greedy") {
    moe["router"] = scoring == "sigmoid" ? "sigmoid_group_topk" : "softmax_topk";
    const auto* groups = doc_.find(r_.path_of("n_group"));
    r_.has("n_group");
    r_.has("topk_group");
    if (groups != nullptr && !groups->is_null()) {
      moe["groups"] = integer("n_group", "moe.groups", 1 << 20);
      moe["topk_groups"] = integer_or("topk_group", "moe.topk_groups", 1, 1 << 20);
    }
  }
  moe["aux_loss_coeff"] = r_.number_or("aux_loss_alpha", 0.001);
  for (const char* key : {"routed_scaling_factor", "norm_topk_prob", "seq_aux", "ep_size"}) {
    r_.has(key);
  }
  m["moe"] = std::move(moe);
  if (type == "deepseek_v3") {
    const auto* mtp = doc_.find(r_.path_of("num_nextn_predict_layers"));
    r_.has("num_nextn_predict_layers");
    if (mtp != nullptr && mtp->is_number_integer() && mtp->get<int>() > 0) {
      note("num_nextn_predict_layers " + shown(*mtp) +
           ": the multi-token-prediction module is not modelled (left out)");
    }
  }
}

void HfReader::read_gpt2(json& m) {
  const auto hidden = integer("n_embd", "hidden");
  m["hidden"] = hidden;
  m["layers"] = integer("n_layer", "layers", 100'000);
  m["heads"] = integer("n_head", "heads");
  m["kv_heads"] = m["heads"];
  hf_key_["kv_heads"] = "n_head";
  m["ffn_hidden"] = integer_or("n_inner", "ffn_hidden", 4 * hidden);  // null: 4 x n_embd
  m["vocab"] = integer("vocab_size", "vocab", 1 << 30);
  m["max_seq_len"] = integer_or("n_positions", "max_seq_len", 1024);
  const std::string act = r_.string_or("activation_function", "gelu_new");
  m["activation"] = "gelu";
  gelu_note("activation_function", act);
  m["tied_embeddings"] = r_.boolean_or("tie_word_embeddings", true);
  m["position_embedding"] = "learned";
  m["norm"] = "layernorm";
  m["bias"] = true;
  m["causal"] = true;
  if (r_.boolean_or("add_cross_attention", false)) {
    r_.fail("add_cross_attention", "cross-attention (an encoder-decoder) is not modelled");
  }
}

void HfReader::read_mha_shape(json& m, std::int64_t max_seq_len) {
  m["hidden"] = integer("hidden_size", "hidden");
  m["ffn_hidden"] = integer("intermediate_size", "ffn_hidden");
  m["layers"] = integer("num_hidden_layers", "layers", 100'000);
  m["heads"] = integer("num_attention_heads", "heads");
  m["kv_heads"] = m["heads"];
  hf_key_["kv_heads"] = "num_attention_heads";
  m["vocab"] = integer("vocab_size", "vocab", 1 << 30);
  m["max_seq_len"] = integer_or("max_position_embeddings", "max_seq_len", max_seq_len);
  gelu_note("hidden_act", r_.string_or("hidden_act", "gelu"));
  m["activation"] = "gelu";
}

void HfReader::read_neox(json& m) {
  read_mha_shape(m, 2048);
  m["tied_embeddings"] = r_.boolean_or("tie_word_embeddings", false);
  m["position_embedding"] = "rotary";  // rotary_pct of each head: no parameters either way
  m["norm"] = "layernorm";
  m["bias"] = r_.boolean_or("attention_bias", true);
  m["causal"] = true;
  if (r_.boolean_or("use_parallel_residual", true)) {
    note(
        "use_parallel_residual: attention and MLP read the same input; modelled one after "
        "the other (the same work and parameters)");
  }
}

void HfReader::read_bert(json& m) {
  read_mha_shape(m, 512);
  m["tied_embeddings"] = r_.boolean_or("tie_word_embeddings", true);
  const std::string positions = r_.string_or("position_embedding_type", "absolute");
  if (positions != "absolute") {
    r_.fail("position_embedding_type",
            "only BERT's absolute (learned) position embeddings are modelled, got " +
                quote_text(positions));
  }
  m["position_embedding"] = "learned";
  m["norm"] = "layernorm";
  m["bias"] = true;
  m["causal"] = false;
}

void HfReader::read_dropout(json& m, const std::string& type) {
  const double fallback = type == "gpt2" ? 0.1 : 0.0;
  const auto read = [&](const char* ours, std::initializer_list<const char*> keys) {
    double p = fallback;
    for (const char* key : keys) {
      const auto* v = doc_.find(r_.path_of(key));
      r_.has(key);
      if (v == nullptr || v->is_null()) continue;
      p = r_.number(key);
      if (auto problem = dropout_problem(p)) r_.fail(key, *problem);
      hf_key_[ours] = key;
      break;
    }
    m[ours] = p;
  };
  read("hidden_dropout", {"resid_pdrop", "hidden_dropout", "hidden_dropout_prob"});
  read("attention_dropout", {"attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"});
  if (type == "gpt2") {
    const auto* v = doc_.find(r_.path_of("embd_pdrop"));
    if (v != nullptr && v->is_number() && v->get<double>() != m["hidden_dropout"].get<double>()) {
      note("embd_pdrop " + shown(*v) + " is modelled as resid_pdrop (" +
           shown(m["hidden_dropout"]) + "): the embedding dropout runs with the hidden one");
    }
  }
}

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}
NoteSink& sink() {
  static NoteSink s;
  return s;
}

}  // namespace

std::string foreign::closest_mapped(std::string_view name, const std::vector<std::string>& mapped) {
  if (name.size() > kSuggestLength) return {};
  std::string best;
  std::size_t best_distance = kTypoDistance + 1;
  for (const auto& m : mapped) {
    const std::size_t d = config::edit_distance(name, m);
    if (d < best_distance) {
      best_distance = d;
      best = m;
    }
  }
  return best;
}

std::string foreign::shown(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

ForeignInput deepspeed_from_text(std::string_view text, const std::string& source) {
  return DeepSpeedReader(source).read(parse_json(text, source));
}

ForeignInput load_deepspeed(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    throw ConfigError(file.string(), "",
                      std::filesystem::exists(file, ec) ? "cannot be read" : "no such file");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return deepspeed_from_text(buffer.str(), file.string());
}

std::vector<std::string> split_shell_words(std::string_view text, const std::string& source) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (i + 1 < text.size()) {
        if (text[i + 1] != '\n') word += text[i + 1];  // backslash-newline continues the line
        ++i;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      const std::size_t open = i;
      for (++i; i < text.size() && text[i] != c; ++i) {
        // In double quotes a backslash escapes only $ ` " \ and newline, as in sh.
        if (c == '"' && text[i] == '\\' && i + 1 < text.size() &&
            std::string_view("$`\"\\\n").find(text[i + 1]) != std::string_view::npos) {
          ++i;
        }
        word += text[i];
      }
      if (i >= text.size()) {
        throw ConfigError(source, "",
                          std::string("unterminated ") + (c == '"' ? "double" : "single") +
                              " quote opened at byte " + std::to_string(open));
      }
      continue;
    }
    word += c;
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

ForeignInput megatron_from_args(std::string_view args, const std::string& source) {
  return MegatronReader(source).read(args);
}

bool is_hf_config(const nlohmann::json& object) {
  return object.is_object() && (object.contains("model_type") || object.contains("architectures"));
}

bool convert_hf_model(config::Document& doc, const std::string& path,
                      std::vector<std::string>& notes) {
  const json* v = doc.find(path);
  if (v == nullptr || !is_hf_config(*v)) return false;
  HfReader(doc, path, notes, "the Hugging Face config.json at " + path).convert();
  return true;
}

TransformerModel hf_model_from_text(std::string_view text, const std::string& source,
                                    std::vector<std::string>& notes) {
  auto doc =
      config::Document::from_json(json::object({{"model", parse_json(text, source)}}), source);
  const json* model = doc.find("model");
  if (!is_hf_config(*model)) {
    doc.fail("model",
             "expected a Hugging Face config.json (with \"model_type\" or "
             "\"architectures\")");
  }
  HfReader(doc, "model", notes, source).convert();
  return read_model(doc, "model");
}

void set_note_sink(NoteSink s) {
  std::lock_guard lock(sink_mutex());
  sink() = std::move(s);
}

void report_note(const std::string& note) {
  std::lock_guard lock(sink_mutex());
  if (sink()) sink()(note);
}

}  // namespace stratasim::strategies
