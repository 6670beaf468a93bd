#include "study/accuracy.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>

#include "hw_models/cluster.hpp"
#include "hw_models/config_reader.hpp"
#include "sim/cost.hpp"
#include "sim/network.hpp"
#include "strategies/program.hpp"
#include "study/calibration_set.hpp"
#include "study/catalog.hpp"
#include "study/collective_fit.hpp"
#include "study/fit.hpp"
#include "study/study.hpp"

namespace stratasim::study {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- Where the mapping's choices live (docs/accuracy.md lists them).

// Whether the experiment documents carry the source's training framework as
// training.framework. Off until the loader accepts the key; the framework of each source is
// framework_of()'s.
constexpr bool kSetTrainingFramework = true;

// The framework each end-to-end source trained with (the sources' notes): PyTorch FSDP
// (Composer, torchtitan), plain DDP with ZeRO-1 (the flash-attention GPT runs, PyTorch
// Lightning), Megatron-Core (NeMo, Megatron-LM, Megatron-Bridge, the DGX Cloud recipes).
std::string framework_of(const std::string& source) {
  if (source == "llm-foundry-benchmarks" || source.starts_with("torchtitan")) return "fsdp";
  if (source == "flash-attn-training-gpt3") return "generic";
  return "megatron";
}

// The fused attention kernel of each end-to-end source's software stack, where the source fixes
// it: the flash-attention GPT-3 runs are of the FlashAttention (v1) repository of January 2023
// (the source's notes). llm-foundry's benchmark tables were produced by its
// scripts/train/benchmarking/submit_benchmarks.py, whose --attn_impl defaults to "triton" and is
// written into every run's model config (sweep.sh never sets it), as its MPT pretraining yamls
// also set: Tri Dao's FlashAttention in Triton. Others keep the default (FlashAttention-2).
std::optional<std::string> attention_kernel_of(const std::string& source) {
  if (source == "flash-attn-training-gpt3") return "flash-attention";
  if (source == "llm-foundry-benchmarks") return "flash-attention-triton";
  return std::nullopt;
}

// End to end: the GPU as a case names it -> the one-node catalog cluster simulated.
struct ClusterOf {
  std::string_view gpu;
  std::string_view cluster;
};
constexpr ClusterOf kClusters[] = {
    {"A100-40GB", "dgx-a100-40gb-1"},
    {"A100-80GB", "dgx-a100-1"},
    {"A100-SXM4-80GB (400W)", "dgx-a100-1"},
    {"H100-SXM-80GB", "dgx-h100-1"},
    {"H100", "dgx-h100-1"},  // Megatron-Bridge's tables: system DGX-H100, the SXM5 80 GB part
    // Megatron-Bridge's and NeMo's Blackwell rows (systems DGX-B200, DGX-B300, DGX-GB200,
    // DGX-GB300, 8 GPUs each): a DGX B200 / B300 node; on GB200 and GB300, 8 GPUs (two compute
    // trays) of an NVL72 rack, all in its NVLink domain.
    {"B200", "dgx-b200-1"},
    {"B300", "dgx-b300-1"},
    {"GB200", "gb200-nvl72-8gpus"},
    {"GB300", "gb300-nvl72-8gpus"},
};
constexpr int kGpusPerNode = 8;  // every cluster above is one node (NVLink domain) of 8 GPUs

// Kernel level: the catalog devices kernel cases are costed on, in the order they are tried
// (a case goes to the first whose published_names list its GPU: H100 measurements to the H100,
// though the H200 lists them too; B300 measurements to the B300, though the GB300 lists them).
constexpr std::string_view kKernelDevices[] = {"a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb",
                                               "b200-sxm-180gb", "b300-sxm-288gb", "gb200-186gb",
                                               "gb300-288gb"};

// Model names of the calibration set -> catalog models (configs/models, or a Hugging Face
// config.json of configs/models/hf read as the model: one source of truth for the shape), for
// cases that name a model without giving its shape. Keys are lower case without spaces, '-', '_'
// or '.'; a variant in parentheses ("Qwen3_30B_a3B (tokendrop)") is model_variant()'s.
const std::map<std::string, std::string>& catalog_models() {
  static const std::map<std::string, std::string> models = {
      {"llama27b", "llama2-7b"},    {"llama213b", "llama2-13b"},     {"llama270b", "llama2-70b"},
      {"llama38b", "llama3-8b"},    {"llama318b", "llama3-8b"},      {"llama370b", "llama3-70b"},
      {"llama3170b", "llama3-70b"}, {"qwen330ba3b", "qwen3-30b-a3b"}};
  return models;
}

// Model-name fragments (lower case) of mixture-of-experts models, for cases that do not print
// an expert-parallel degree.
constexpr std::string_view kMoeNames[] = {"a3b",     "a22b",     "grok",
                                          "mixtral", "deepseek", "nemotron_3"};

// The variants Megatron-Bridge's tables print after a MoE model's name, in parentheses, and what
// each sets on the model (docs/accuracy.md):
// - "dropless": every token reaches its experts (the default: no capacity factor);
// - "tokendrop": Megatron-Bridge's token-drop recipes set --moe-expert-capacity-factor 1.0 with
//   the expert inputs padded to that capacity (moe_pad_expert_input_to_capacity): an expert takes
//   at most ceil(1.0 x its even share) of the routed tokens (model.moe.capacity_factor 1.0).
struct ModelVariant {
  std::string_view name;
  std::optional<double> capacity_factor;
};
constexpr ModelVariant kModelVariants[] = {{"dropless", std::nullopt}, {"tokendrop", 1.0}};

// ---- Reading the calibration file: every field the mapping needs, checked, with errors naming
// the file and the JSON path.

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string squeezed(std::string_view s) {
  std::string out;
  for (char c : lower(s)) {
    if (c != ' ' && c != '-' && c != '_' && c != '.') out.push_back(c);
  }
  return out;
}

class CaseReader {
 public:
  CaseReader(const config::Document& doc, std::string path) : doc_(doc), path_(std::move(path)) {
    const json* node = doc.find(path_);
    if (node == nullptr || !node->is_object()) doc.fail(path_, "expected a case object");
    id_ = required_string("id");
  }
  const std::string& id() const { return id_; }
  const std::string& path() const { return path_; }

  const json* find(const std::string& key) const { return doc_.find(path_ + "." + key); }
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const {
    doc_.fail(path_ + "." + key, expected + " (case " + id_ + ")");
  }
  bool present(const std::string& key) const {
    const json* v = find(key);
    return v != nullptr && !v->is_null();
  }

  std::string required_string(const std::string& key) const {
    const json* v = doc_.find(path_ + "." + key);
    if (v == nullptr || !v->is_string() || v->get<std::string>().empty()) {
      doc_.fail(path_ + "." + key,
                "expected a non-empty string" + (id_.empty() ? "" : " (case " + id_ + ")"));
    }
    return v->get<std::string>();
  }
  std::optional<std::string> string(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json* v = find(key);
    if (!v->is_string()) fail(key, "expected a string or null");
    return v->get<std::string>();
  }
  // A positive integer, or nullopt when missing or null.
  std::optional<std::int64_t> count(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json* v = find(key);
    if (!v->is_number_integer() || v->get<std::int64_t>() < 0) {
      fail(key, "expected a non-negative integer or null");
    }
    return v->get<std::int64_t>();
  }
  std::int64_t required_count(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr || !v->is_number_integer() || v->get<std::int64_t>() <= 0) {
      fail(key, "expected a positive integer");
    }
    return v->get<std::int64_t>();
  }
  // A positive number, or nullopt when missing or null.
  std::optional<double> number(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json* v = find(key);
    if (!v->is_number() || !(v->get<double>() > 0)) fail(key, "expected a positive number or null");
    return v->get<double>();
  }
  std::optional<bool> boolean(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json* v = find(key);
    if (!v->is_boolean()) fail(key, "expected true, false or null");
    return v->get<bool>();
  }

 private:
  const config::Document& doc_;
  std::string path_;
  std::string id_;
};

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::string gib(Bytes b) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << static_cast<double>(b.count()) / (1LL << 30) << " GiB";
  return out.str();
}

// ---- End to end.

// "0.5M" tokens (the flash-attention README's global batch): M = 2^20, as its configs'
// global_batch_size x 2048 tokens gives (256 -> 0.5M, 512 -> 1M).
std::optional<double> printed_tokens(const std::string& text) {
  if (text.empty()) return std::nullopt;
  const char suffix = text.back();
  const double scale = suffix == 'M' ? 1048576.0 : suffix == 'K' || suffix == 'k' ? 1024.0 : 0.0;
  if (scale == 0.0) return std::nullopt;
  try {
    std::size_t used = 0;
    const double v = std::stod(text.substr(0, text.size() - 1), &used);
    if (used + 1 != text.size() || !(v > 0)) return std::nullopt;
    return v * scale;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The parameter count a model name ends with ("GPT3-760M" -> 7.6e8, "GPT3-2.7B" -> 2.7e9).
std::optional<double> size_in_name(const std::string& name) {
  const auto dash = name.find_last_of('-');
  if (dash == std::string::npos || name.size() < dash + 3) return std::nullopt;
  const std::string tail = name.substr(dash + 1);
  const char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(tail.back())));
  const double scale = suffix == 'M' ? 1e6 : suffix == 'B' ? 1e9 : 0.0;
  if (scale == 0.0) return std::nullopt;
  try {
    std::size_t used = 0;
    const double v = std::stod(tail.substr(0, tail.size() - 1), &used);
    if (used + 1 != tail.size()) return std::nullopt;
    return v * scale;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// PyTorch FSDP's settings of a run that printed its sharding strategy (training.fsdp,
// strategies/fsdp.hpp): the sharding and, when printed, Composer's mixed-precision mode
// (llm-foundry's fsdp_config.mixed_precision: DEFAULT with amp_bf16 = bf16 parameters,
// gradients reduced in fp32; PURE = all bf16). llm-foundry's benchmark runs also take what its
// pretraining yamls (scripts/train/yamls/pretrain/mpt-*.yaml) set, limit_all_gathers: true, and
// for what neither the yamls nor submit_benchmarks.py set, Composer's FSDP defaults of the
// time (composer/trainer/dist_strategy.py, 2023: backward_prefetch BACKWARD_POST,
// forward_prefetch false). Wrapping is per block (MPT's fsdp_wrap_fn: each MPTBlock).
json fsdp_settings_of(const CaseReader& c, const std::string& source, const std::string& sharding) {
  json fsdp = {{"sharding_strategy", sharding}};
  if (const auto mode = c.string("config.fsdp_mixed_precision_mode")) {
    if (*mode != "DEFAULT" && *mode != "PURE" && *mode != "FULL") {
      c.fail("config.fsdp_mixed_precision_mode", "expected DEFAULT, PURE or FULL");
    }
    fsdp["mixed_precision"] = *mode;
  }
  if (source == "llm-foundry-benchmarks") {
    fsdp["limit_all_gathers"] = true;
    fsdp["backward_prefetch"] = "BACKWARD_POST";
    fsdp["forward_prefetch"] = false;
  }
  return fsdp;
}

// training.fp8 of a run that trained in FP8 (strategies/precision.hpp), from the precision it
// printed and its software stack's recipe, or nothing for a precision not mapped:
// - "amp_fp8" (Composer / llm-foundry): Transformer Engine's fp8_autocast with Composer's
//   recipe, DelayedScaling(fp8_format=HYBRID, amax_history_len=16, amax_compute_algo="max");
// - "fp8", "fp8 (hybrid)" (NeMo 24.07, Megatron-LM's Llama recipe, the DGX Cloud recipes): NeMo's
//   and Megatron-LM's delayed scaling, HYBRID; NeMo's amax history (fp8_amax_history_len 1024,
//   fp8_amax_compute_algo max);
// - "FP8-CS" (Megatron-Bridge's bf16_with_fp8_current_scaling_mixed): current ("tensorwise")
//   scaling, HYBRID, the first and last layer in bf16, FP8 parameter gathering;
// - "FP8-MX", "MXFP8" (Megatron-Bridge's bf16_with_mxfp8_mixed): MXFP8, E4M3, FP8 parameter
//   gathering;
// - "bf16 + float8 linears" (torchtitan's float8 linears, torchao's tensorwise dynamic scaling):
//   current scaling, E4M3.
std::optional<json> fp8_settings_of(const std::string& precision) {
  const std::string p = lower(precision);
  if (p == "amp_fp8") {
    return json{{"format", "hybrid"},
                {"recipe", "delayed"},
                {"amax_history_len", 16},
                {"amax_compute_algo", "max"}};
  }
  if (p == "fp8" || p == "fp8 (hybrid)") {
    return json{{"format", "hybrid"},
                {"recipe", "delayed"},
                {"amax_history_len", 1024},
                {"amax_compute_algo", "max"}};
  }
  if (p == "fp8-cs" || p == "fp8-cs (fp8-mx)") {
    return json{{"format", "hybrid"},
                {"recipe", "current"},
                {"bf16_first_layers", 1},
                {"bf16_last_layers", 1},
                {"param_gather", true}};
  }
  if (p == "fp8-mx" || p == "mxfp8") {
    return json{{"format", "e4m3"}, {"recipe", "mxfp8"}, {"param_gather", true}};
  }
  if (p == "bf16 + float8 linears") return json{{"format", "e4m3"}, {"recipe", "current"}};
  return std::nullopt;
}

struct E2eMapping {
  std::vector<std::string> reasons;  // empty: expressible
  json experiment;
  /// Settings of a catalog model the case changes (a MoE variant's capacity factor), applied
  /// once the model file is read: "model.moe.capacity_factor" = 1.0.
  std::vector<strategies::Override> model_overrides;
  std::string cluster;
  std::string quantity;  // "tokens/s per GPU" or "step time (s)"
  double published = 0;
};

// The model object of an MPT run (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): no
// biases, LayerNorm, GELU, tied embeddings, ffn = expansion_ratio x d_model; ALiBi has no
// position table, so rotary (which adds no parameters) stands in for it.
json mpt_model(const CaseReader& c, const std::string& name, std::int64_t seq_len) {
  const std::int64_t d = c.required_count("config.d_model");
  return {{"type", "transformer"},
          {"name", name},
          {"source", "calibration case " + c.id() +
                         ": MPT (llm-foundry), no biases, LayerNorm, GELU, tied embeddings, ALiBi "
                         "costed as rotary (no position table), no dropout (emb_pdrop, resid_pdrop "
                         "and attn_pdrop 0, as MPT's published configs)"},
          {"layers", c.required_count("config.n_layers")},
          {"hidden", d},
          {"heads", c.required_count("config.n_heads")},
          {"kv_heads", c.required_count("config.n_heads")},
          {"ffn_hidden", c.required_count("config.expansion_ratio") * d},
          {"vocab", c.required_count("config.vocab_size")},
          {"activation", "gelu"},
          {"tied_embeddings", true},
          {"position_embedding", "rotary"},
          {"max_seq_len", seq_len},
          {"norm", "layernorm"},
          {"bias", false},
          {"causal", true},
          {"hidden_dropout", 0.0},
          {"attention_dropout", 0.0}};
}

// The GPT-3 shapes of the flash-attention training runs (training/configs/experiment/pile,
// the HF GPT-2 model): learned positions, biases, LayerNorm, GELU, tied embeddings, ffn 4h,
// GPT-2's 50257 tokens padded to a multiple of 8 (pad_vocab_size_multiple: 8).
json gpt2_model(const CaseReader& c, const std::string& name, std::int64_t seq_len) {
  const std::int64_t h = c.required_count("config.hidden_size");
  return {{"type", "transformer"},
          {"name", name},
          {"source", "calibration case " + c.id() +
                         ": GPT-3 shape on the GPT-2 model of flash-attention's training/ "
                         "(learned positions, biases, vocab 50257 padded to 50264)"},
          {"layers", c.required_count("config.num_layers")},
          {"hidden", h},
          {"heads", c.required_count("config.num_heads")},
          {"kv_heads", c.required_count("config.num_heads")},
          {"ffn_hidden", 4 * h},
          {"vocab", 50264},
          {"activation", "gelu"},
          {"tied_embeddings", true},
          {"position_embedding", "learned"},
          {"max_seq_len", seq_len},
          {"norm", "layernorm"},
          {"bias", true},
          {"causal", true}};
}

// A model name and the variant printed after it in parentheses: "Qwen3_30B_a3B (tokendrop)" ->
// {"Qwen3_30B_a3B", "tokendrop"}; a name without one -> {name, ""}.
std::pair<std::string, std::string> model_variant(const std::string& name) {
  const auto open = name.rfind('(');
  if (name.empty() || name.back() != ')' || open == std::string::npos) return {name, ""};
  std::string base = name.substr(0, open);
  while (!base.empty() && base.back() == ' ') base.pop_back();
  return {base, name.substr(open + 1, name.size() - open - 2)};
}

// What map_e2e reads from a case before it writes the experiment: each step below fills its
// part and adds a reason to E2eMapping::reasons for what it cannot express.
struct E2eParts {
  std::int64_t gpus = 0;
  std::optional<json> fp8;  // training.fp8, when the precision is an FP8 recipe
  std::string model;        // as printed, variant included
  json model_doc;
  std::int64_t seq = 1;
  std::optional<std::int64_t> micro;
  std::optional<std::int64_t> global;
  std::int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  std::optional<std::int64_t> etp;
  std::string cp_mode = "ring";
  int zero = 0;
  json fsdp;  // training.fsdp: PyTorch FSDP's runtime as the run configured it
  std::string recompute = "none";
  bool flash = true;
};

// The device and the GPU count.
void map_e2e_device(const CaseReader& c, E2eMapping& m, E2eParts& p) {
  const std::string gpu = c.required_string("hardware.gpu");
  const auto* cluster = std::find_if(std::begin(kClusters), std::end(kClusters),
                                     [&](const ClusterOf& k) { return k.gpu == gpu; });
  if (lower(gpu).find("inferred") != std::string::npos) {
    m.reasons.push_back("device not printed (\"" + gpu + "\")");
  } else if (cluster == std::end(kClusters)) {
    m.reasons.push_back("device " + gpu + " not modelled");
  } else {
    m.cluster = std::string(cluster->cluster);
  }
  p.gpus = c.required_count("hardware.gpu_count");
  if (p.gpus != kGpusPerNode) {
    m.reasons.push_back(std::to_string(p.gpus) + " GPUs (the mapping covers one node of " +
                        std::to_string(kGpusPerNode) + ")");
  }
}

// Precision: bf16, or an FP8 recipe.
void map_e2e_precision(const CaseReader& c, E2eMapping& m, E2eParts& p) {
  const auto precision = c.string("config.precision");
  if (!precision) {
    m.reasons.push_back("precision not printed");
  } else if (const std::string lp = lower(*precision);
             lp.find("fp8") != std::string::npos || lp.find("float8") != std::string::npos) {
    p.fp8 = fp8_settings_of(*precision);
    if (!p.fp8) m.reasons.push_back("fp8 recipe of precision " + *precision + " not mapped");
  } else if (lp != "bf16" && lp != "amp_bf16") {
    m.reasons.push_back("precision " + *precision + " not modelled");
  }
}

// The model's variant printed after its name, mixture of experts, context parallelism, LoRA.
void map_e2e_model_options(const CaseReader& c, E2eMapping& m, E2eParts& p) {
  p.model = c.string("config.model").value_or("");
  const auto variant = model_variant(p.model).second;
  if (!variant.empty()) {
    const auto* v = std::find_if(std::begin(kModelVariants), std::end(kModelVariants),
                                 [&](const ModelVariant& k) { return k.name == lower(variant); });
    if (v == std::end(kModelVariants)) {
      m.reasons.push_back("model variant (" + variant + ") not mapped");
    } else if (v->capacity_factor) {
      m.model_overrides.push_back({"model.moe.capacity_factor", *v->capacity_factor,
                                   "calibration case " + c.id() + ": " + p.model});
    }
  }
  // Mixture of experts: the printed expert-parallel degree (parallelism.ep); a MoE model that
  // prints none is not mapped.
  const auto ep_printed = c.count("config.ep");
  p.ep = ep_printed.value_or(1);
  if (!ep_printed &&
      std::any_of(std::begin(kMoeNames), std::end(kMoeNames), [&](std::string_view n) {
        return lower(p.model).find(n) != std::string::npos;
      })) {
    m.reasons.push_back("MoE with no expert-parallel degree printed");
  }
  // Context parallelism (Megatron's --context-parallel-size, NeMo's context_parallel_size): TE's
  // ring attention, Megatron's default cp_comm_type p2p, unless the case names another.
  p.cp = c.count("config.cp").value_or(1);
  if (const auto type = c.string("config.cp_comm_type")) {
    if (*type == "a2a") {
      p.cp_mode = "ulysses";
    } else if (*type == "allgather" || *type == "all_gather") {
      p.cp_mode = "allgather";
    } else if (*type != "p2p") {
      m.reasons.push_back("context parallelism with cp_comm_type " + *type + " not modelled");
    }
  }
  if (lower(c.string("config.task").value_or("")).find("lora") != std::string::npos) {
    m.reasons.push_back("LoRA");
  }
}

// The shapes: the model object, the sequence, the micro and global batches.
void map_e2e_shapes(const CaseReader& c, const std::string& source, E2eMapping& m, E2eParts& p) {
  const auto seq_len = c.count("config.seq_len");
  if (!seq_len) m.reasons.push_back("sequence length not printed");
  p.seq = seq_len.value_or(1);
  const std::string base_model = model_variant(p.model).first;
  if (c.present("config.d_model")) {
    p.model_doc = mpt_model(c, p.model, p.seq);
  } else if (source == "flash-attn-training-gpt3" && c.present("config.hidden_size")) {
    p.model_doc = gpt2_model(c, p.model, p.seq);
  } else if (auto it = catalog_models().find(squeezed(base_model)); it != catalog_models().end()) {
    p.model_doc = it->second;
  } else {
    m.reasons.push_back("model " + (p.model.empty() ? std::string("(unnamed)") : p.model) +
                        ": no shape given and none in the catalog");
  }
  p.micro = c.count("config.micro_batch_size");
  if (!p.micro) p.micro = c.count("config.local_batch_size");
  if (!p.micro) m.reasons.push_back("micro batch not printed");
  p.global = c.count("config.global_batch_size");
  if (!p.global) {
    if (const auto printed = c.string("config.global_batch_printed")) {
      const auto tokens = printed_tokens(*printed);
      if (!tokens) c.fail("config.global_batch_printed", "expected tokens such as \"0.5M\"");
      p.global = std::llround(*tokens / static_cast<double>(p.seq));
    }
  }
  if (!p.global) m.reasons.push_back("global batch not printed");
}

// The published quantity: tokens/s per GPU when given, else the step time.
void map_e2e_published(const CaseReader& c, E2eMapping& m) {
  if (const auto t = c.number("measured.tokens_per_s_per_gpu")) {
    m.quantity = "tokens/s per GPU";
    m.published = *t;
  } else if (const auto d = c.number("derived.tokens_per_s_per_gpu")) {
    m.quantity = "tokens/s per GPU";
    m.published = *d;
  } else if (const auto s = c.number("measured.step_time_s")) {
    m.quantity = "step time (s)";
    m.published = *s;
  } else {
    m.reasons.push_back("no tokens/s per GPU or step time published");
  }
}

// The parallel strategy: degrees, ZeRO or FSDP, recomputation, the attention kernel.
void map_e2e_strategy(const CaseReader& c, const std::string& source, E2eMapping& m, E2eParts& p) {
  p.tp = c.count("config.tp").value_or(1);
  p.pp = c.count("config.pp").value_or(1);
  if (p.tp < 1 || p.pp < 1 || p.gpus % (p.tp * p.pp * p.cp) != 0) {
    m.reasons.push_back("tp x pp x cp does not divide the GPUs");
  }
  // Expert tensor parallelism: printed, or Megatron-Core's default when tp is 1
  // (expert_tensor_parallel_size unset takes tensor_model_parallel_size: 1, as Megatron-Bridge's
  // MoE recipes also set it). With tp above 1 the default (tp) and the recipes' 1 differ, so a
  // case that does not print it is not mapped.
  p.etp = c.count("config.etp");
  if (p.ep > 1 && !p.etp) {
    if (p.tp == 1) {
      p.etp = 1;
    } else {
      m.reasons.push_back("expert tensor parallelism not printed (tp " + std::to_string(p.tp) +
                          ")");
    }
  }
  const std::string framework = framework_of(source);
  if (const auto sharding = c.string("config.fsdp_sharding")) {
    if (*sharding == "FULL_SHARD" || *sharding == "SHARD_GRAD_OP" || *sharding == "NO_SHARD" ||
        *sharding == "HYBRID_SHARD") {
      p.fsdp = fsdp_settings_of(c, source, *sharding);
    } else {
      m.reasons.push_back("FSDP sharding " + *sharding + " not mapped");
    }
  } else if (c.count("config.fsdp").value_or(0) > 1) {
    p.zero = 3;  // FSDP (torchtitan, Megatron FSDP) over the data-parallel ranks
  } else if (source == "flash-attn-training-gpt3") {
    // "760M+ use DDP with ZeRO-1" (the source's notes).
    const auto size = size_in_name(p.model);
    if (!size) c.fail("config.model", "expected a name ending in the size, such as GPT3-760M");
    p.zero = *size >= 760e6 ? 1 : 0;
  } else if (framework == "megatron") {
    p.zero = 1;  // Megatron-Core's distributed optimizer, NeMo's default
  }
  if (const json* ac = c.find("config.activation_checkpointing"); ac && !ac->is_null()) {
    if (ac->is_boolean()) {
      p.recompute = ac->get<bool>() ? "full" : "none";
    } else if (ac->is_string() && (*ac == "full" || *ac == "selective" || *ac == "none")) {
      p.recompute = ac->get<std::string>();
    } else {
      c.fail("config.activation_checkpointing", "expected true, false, \"full\" or \"selective\"");
    }
  }
  if (c.boolean("config.activation_cpu_offload").value_or(false)) {
    m.reasons.push_back("activation CPU offload");
  }
  p.flash = lower(c.string("config.attn_impl").value_or("flash")) == "flash";
}

// The experiment document of an expressible case.
json e2e_experiment(const CaseReader& c, const std::string& source, const E2eMapping& m,
                    const E2eParts& p) {
  json parallelism = {{"tp", p.tp},
                      {"pp", p.pp},
                      {"dp", p.gpus / (p.tp * p.pp * p.cp)},
                      {"micro_batch", *p.micro},
                      {"recompute", p.recompute}};
  if (p.cp > 1) {
    parallelism["cp"] = p.cp;
    parallelism["cp_mode"] = p.cp_mode;
  }
  if (p.ep > 1) {
    // No case prints its token dispatcher. Megatron-Bridge's performance recipes
    // (scripts/performance/configs/qwen/) run the flex dispatcher with DeepEP or HybridEP, which
    // within one NVLink domain sends each routed copy once to its expert's rank and back: the
    // all-to-all dispatcher's traffic (docs/accuracy.md).
    parallelism["ep"] = p.ep;
    parallelism["etp"] = *p.etp;
    parallelism["moe_token_dispatcher"] = "alltoall";
  }
  if (p.fsdp.is_null()) parallelism["zero"] = p.zero;  // else the FSDP sharding's
  if (const std::int64_t vp = c.count("config.vp").value_or(1); vp > 1 && p.pp > 1) {
    parallelism["schedule"] = "interleaved";
    parallelism["virtual_stages"] = vp;
  }
  json training = {{"global_batch", *p.global},
                   {"seq_len", p.seq},
                   {"dtype", "bf16"},
                   {"flash_attention", p.flash}};
  if (kSetTrainingFramework) training["framework"] = framework_of(source);
  if (!p.fsdp.is_null()) training["fsdp"] = p.fsdp;
  if (p.fp8) {
    training["dtype"] = "fp8";
    training["fp8"] = *p.fp8;
  }
  if (const auto kernel = attention_kernel_of(source); kernel && p.flash) {
    training["attention_kernel"] = *kernel;
  }
  return {{"name", c.id()},
          {"description", "calibration case " + c.id() + " (" + source + ")"},
          {"model", p.model_doc},
          {"cluster", m.cluster},
          {"parallelism", parallelism},
          {"training", training}};
}

E2eMapping map_e2e(const CaseReader& c, const std::string& source) {
  E2eMapping m;
  E2eParts p;
  map_e2e_device(c, m, p);
  map_e2e_precision(c, m, p);
  map_e2e_model_options(c, m, p);
  map_e2e_shapes(c, source, m, p);
  map_e2e_published(c, m);
  map_e2e_strategy(c, source, m, p);
  if (m.reasons.empty()) m.experiment = e2e_experiment(c, source, m, p);
  return m;
}

void compare_e2e(const CaseReader& c, const std::string& source, const TrainingOverrides& overrides,
                 AccuracyReport& out) {
  E2eMapping m = map_e2e(c, source);
  const std::string framework = framework_of(source);
  if (m.reasons.empty()) {
    if (auto it = overrides.by_framework.find(framework); it != overrides.by_framework.end()) {
      m.experiment["training"].update(it->second);
    }
  }
  const std::string gpu = c.required_string("hardware.gpu");
  if (!m.reasons.empty()) {
    out.unexpressed.push_back({AccuracyLevel::e2e, c.id(), source, join(m.reasons)});
    return;
  }
  strategies::Experiment experiment;
  const json document = m.experiment;
  try {
    experiment =
        from_json(std::move(m.experiment), m.model_overrides, "calibration case " + c.id());
  } catch (const config::ConfigError& e) {
    out.unexpressed.push_back({AccuracyLevel::e2e, c.id(), source,
                               std::string("the experiment loader rejects it: ") + e.what()});
    return;
  }
  const std::string die = experiment.cluster.device.die;
  if (auto it = overrides.by_die.find(die); it != overrides.by_die.end()) {
    experiment.cluster.device.efficiency.die_gemm = it->second.gemm;
    experiment.cluster.device.efficiency.die_attention = it->second.attention;
  }
  Options options;
  options.record_memory = false;  // peaks and verdicts are kept without the samples
  options.mirror_tensor_parallel = true;
  const Result r = simulate(std::move(experiment), options);
  if (!r.finished()) {
    out.unexpressed.push_back({AccuracyLevel::e2e, c.id(), source,
                               "the simulation did not complete: " + r.timeline.problem});
    return;
  }
  AccuracyRow row;
  row.level = AccuracyLevel::e2e;
  row.id = c.id();
  row.source = source;
  row.framework = framework;
  row.series = source;
  row.device = gpu;
  row.die = die;
  row.mapped_to = m.cluster;
  row.quantity = m.quantity;
  row.published = m.published;
  row.predicted = m.quantity == "step time (s)"
                      ? r.report.iteration_time_s
                      : r.report.tokens_per_s / r.experiment.cluster.world_size();
  row.error = (row.predicted - row.published) / row.published;
  row.peak_memory_fraction = static_cast<double>(r.report.peak_memory.count()) /
                             static_cast<double>(r.context.device_capacity.count());
  row.experiment = document;
  for (const auto& o : m.model_overrides) {
    row.note += (row.note.empty() ? "" : "; ") + o.path + " " + o.value.dump();
  }
  if (!r.report.fits) {
    row.note += std::string(row.note.empty() ? "" : "; ") + "predicted out of memory: peak " +
                gib(r.report.peak_memory) + " of " + gib(r.context.device_capacity);
  }
  out.rows.push_back(std::move(row));
}

// ---- Kernel level.

class Devices {
 public:
  const hw::DeviceSpec& get(std::string_view name) {
    auto it = devices_.find(std::string(name));
    if (it == devices_.end()) {
      const fs::path file = config_dir() / "hardware" / "devices" / (std::string(name) + ".json");
      it = devices_.emplace(std::string(name), hw::load_device(file)).first;
    }
    return it->second;
  }

 private:
  std::map<std::string, hw::DeviceSpec> devices_;
};

// Kernel level: the cases of study/calibration_set.hpp (one reader of the kernel cases for the
// fit and for this table), each costed on the first device of kKernelDevices whose
// published_names list the case's GPU.
void compare_kernels(const fs::path& calibration, Devices& devices, AccuracyReport& out) {
  std::vector<std::string> skipped;
  const auto cases =
      kernel_cases(load_calibration(calibration.string()), calibration.string(), &skipped);
  for (const auto& s : skipped) {
    const auto colon = s.find(": ");
    const std::string id = s.substr(0, colon);
    const bool attention =
        id.find('@') != std::string::npos || s.find("kernel ") != std::string::npos;
    out.unexpressed.push_back({attention ? AccuracyLevel::attention : AccuracyLevel::gemm, id, "",
                               colon == std::string::npos ? s : s.substr(colon + 2)});
  }
  for (const auto& c : cases) {
    const hw::DeviceSpec* device = nullptr;
    std::string_view device_file;
    for (std::string_view name : kKernelDevices) {
      const hw::DeviceSpec& d = devices.get(name);
      if (std::find(d.published_names.begin(), d.published_names.end(), c.gpu) !=
          d.published_names.end()) {
        device = &d;
        device_file = name;
        break;
      }
    }
    const AccuracyLevel level = c.attention ? AccuracyLevel::attention : AccuracyLevel::gemm;
    if (device == nullptr) {
      out.unexpressed.push_back({level, c.id, c.source, "device " + c.gpu + " not modelled"});
      continue;
    }
    AccuracyRow row;
    row.level = level;
    row.id = c.id;
    row.source = c.source;
    row.series = c.attention ? c.series + " on " + device->name : c.source;
    row.device = c.gpu;
    row.mapped_to = std::string(device_file);
    row.quantity = "TFLOP/s";
    row.published = c.published_tflops;
    row.predicted = c.flops / predicted_seconds(*device, c) / 1e12;
    row.error = (row.predicted - row.published) / row.published;
    if (c.gpu == "H800 SXM5") {
      row.note =
          "H800 costed as H100 SXM5: same SMs, clocks and peak FLOP/s (only NVLink is reduced)";
    }
    out.rows.push_back(std::move(row));
  }
}

/// The collective table: every point of the collective sweeps (study/collective_fit.hpp).
void compare_collectives(const fs::path& calibration, AccuracyReport& out) {
  const auto overheads = tool_overheads(config_dir() / "hardware" / "nccl");
  std::map<std::string, hw::ClusterSpec> clusters;
  for (const auto& p : collective_points(calibration)) {
    if (!p.excluded.empty()) {
      out.unexpressed.push_back({AccuracyLevel::collective, p.id, p.source, p.excluded});
      continue;
    }
    auto it = clusters.find(p.cluster);
    if (it == clusters.end()) {
      it = clusters.emplace(p.cluster, hw::load_cluster(resolve_cluster(p.cluster))).first;
    }
    const auto tool = overheads.find(p.tool);
    const Time overhead = tool == overheads.end() ? Time::zero() : tool->second;
    const CollectivePrediction predicted = predict(p, it->second, overhead);
    AccuracyRow row;
    row.level = AccuracyLevel::collective;
    row.id = p.id;
    row.source = p.source;
    row.series = p.series;
    row.device = p.system;
    row.mapped_to = p.cluster;
    row.quantity = "busbw (GB/s)";
    row.published = p.published_busbw / 1e9;
    row.predicted = predicted.busbw / 1e9;
    row.error = row.predicted / row.published - 1;
    row.bytes = p.bytes.count();
    row.note = p.p2p ? std::string("send/recv")
                     : std::string(hw::name_of(predicted.algorithm)) +
                           (predicted.protocol ? "/" + std::string(hw::name_of(*predicted.protocol))
                                               : std::string());
    if (p.fixed != hw::CollectiveAlgorithm::automatic) row.note += " (ring fixed)";
    if (overhead > Time::zero()) row.note += ", +" + to_string(overhead) + " " + p.tool;
    out.rows.push_back(std::move(row));
  }
}

/// The MoE all-to-all table: DeepEP's dispatch and combine on H800s (category
/// "moe_all_to_all"), costed on configs/hardware/clusters/dgx-h800-2048.json by the cluster's
/// network model (docs/accuracy.md, docs/moe.md). The buffer of one rank: S = tokens_per_batch
/// x topk x hidden x e (dispatch fp8: e = 1 + 4 / 128 for DeepEP's per-128-channel fp32 scales;
/// combine bf16: e = 2).
/// - Normal kernels: an all-to-all over the ep ranks (8 per node) as NCCL's model costs it;
///   the bottleneck bandwidth is what crosses the bottleneck link per unit of time: NVLink
///   within a node, S (n - 1) / n / t; RDMA across nodes, S (n - k) / n / t.
/// - Low-latency kernels (pure RDMA, every peer at once through IBGDA): t = S / (p2p
///   efficiency x NIC bandwidth) of the network fabric, no per-step latency.
void compare_moe(const fs::path& calibration, AccuracyReport& out) {
  const config::Document doc = config::Document::load(calibration);
  const json* cases = doc.find("cases");
  const std::string cluster_name = "dgx-h800-2048";
  const hw::ClusterSpec cluster = hw::load_cluster(resolve_cluster(cluster_name));
  const sim::AnalyticalNetwork network(cluster);
  const int k_node = cluster.devices_per_node;
  const double nic = cluster.inter_node.bandwidth.bytes_per_second();
  const double p2p =
      cluster.collectives.nccl ? cluster.collectives.nccl->network.p2p_efficiency : 1.0;
  for (std::size_t i = 0; i < cases->size(); ++i) {
    const CaseReader c(doc, "cases." + std::to_string(i));
    if (c.required_string("category") != "moe_all_to_all") continue;
    const std::string source = c.required_string("source.ref");
    const std::string kernel = c.required_string("config.kernel");
    const int ep = static_cast<int>(c.required_count("config.ep"));
    const double tokens = static_cast<double>(c.required_count("config.tokens_per_batch"));
    const double hidden = static_cast<double>(c.required_count("config.hidden"));
    const double topk = static_cast<double>(c.required_count("config.topk"));
    const bool low_latency = kernel.find("low-latency") != std::string::npos;
    if (ep > cluster.world_size()) {
      out.unexpressed.push_back({AccuracyLevel::moe, c.id(), source,
                                 "ep " + std::to_string(ep) + " exceeds " + cluster_name});
      continue;
    }
    for (const char* phase : {"dispatch", "combine"}) {
      const bool dispatch = std::string(phase) == "dispatch";
      const double e = dispatch ? 1.0 + 4.0 / 128.0 : 2.0;
      const double s = tokens * topk * hidden * e;
      AccuracyRow row;
      row.level = AccuracyLevel::moe;
      row.id = c.id() + "/" + phase;
      row.source = source;
      row.device = c.string("hardware.gpu").value_or("");
      row.mapped_to = cluster_name;
      row.bytes = static_cast<std::int64_t>(s);
      if (low_latency) {
        const auto published = c.number(std::string("measured.") + phase + "_latency_us");
        if (!published) continue;
        row.series = "DeepEP low-latency (pure RDMA)";
        row.quantity = std::string(phase) + " latency (us)";
        row.published = *published;
        row.predicted = s / (p2p * nic) * 1e6;
        row.note = "S / (p2p efficiency x NIC)";
      } else {
        const auto published = c.number(std::string("measured.") + phase + "_bottleneck_bw_GBps");
        if (!published) continue;
        const int nodes = (ep + k_node - 1) / k_node;
        const int k = std::min(ep, k_node);
        const sim::GroupShape shape{ep, nodes, k};
        const double t = network
                             .collective_time(strategies::CollectiveKind::all_to_all, shape,
                                              Bytes(static_cast<std::int64_t>(s)))
                             .seconds();
        const double crossing = nodes == 1 ? (ep - 1.0) / ep : (ep - k) / static_cast<double>(ep);
        row.series = nodes == 1 ? "DeepEP normal, NVLink" : "DeepEP normal, RDMA";
        row.quantity = std::string(phase) + (nodes == 1 ? " NVLink" : " RDMA") + " GB/s";
        row.published = *published;
        row.predicted = s * crossing / t / 1e9;
        row.note = "NCCL model all-to-all";
      }
      row.error = row.predicted / row.published - 1;
      out.rows.push_back(std::move(row));
    }
  }
}

}  // namespace

std::string_view name_of(AccuracyLevel level) {
  switch (level) {
    case AccuracyLevel::e2e:
      return "e2e";
    case AccuracyLevel::gemm:
      return "gemm";
    case AccuracyLevel::attention:
      return "attention";
    case AccuracyLevel::collective:
      return "collective";
    case AccuracyLevel::moe:
      return "moe";
  }
  return "?";
}

AccuracyReport accuracy(const fs::path& calibration, const AccuracyOptions& options,
                        const TrainingOverrides& overrides) {
  const config::Document doc = config::Document::load(calibration);
  const json* cases = doc.find("cases");
  if (cases == nullptr || !cases->is_array()) doc.fail("cases", "expected a list of cases");
  AccuracyReport out;
  out.calibration = calibration;
  out.cases = static_cast<int>(cases->size());
  Devices devices;
  std::map<std::string, int> others;
  for (std::size_t i = 0; i < cases->size(); ++i) {
    const CaseReader c(doc, "cases." + std::to_string(i));
    const std::string category = c.required_string("category");
    const std::string source = c.required_string("source.ref");
    if (category == "e2e_training") {
      if (options.e2e) compare_e2e(c, source, overrides, out);
    } else if (category == "gemm" || category == "attention_kernel") {
      continue;  // compare_kernels, below
    } else if (category == "collective" && options.collectives) {
      continue;  // compare_collectives, below
    } else if (category == "moe_all_to_all" && options.collectives) {
      continue;  // compare_moe, below
    } else {
      ++others[category];
    }
  }
  if (options.kernels) compare_kernels(calibration, devices, out);
  if (options.collectives) compare_collectives(calibration, out);
  if (options.collectives) compare_moe(calibration, out);
  out.other_categories.assign(others.begin(), others.end());
  return out;
}

std::vector<ErrorSummary> summaries(const AccuracyReport& report, AccuracyLevel level) {
  std::vector<ErrorSummary> out{{.group = "all"}};
  auto add = [](ErrorSummary& s, double error) {
    const double e = std::abs(error);
    s.mean_abs_error = (s.mean_abs_error * s.rows + e) / (s.rows + 1);
    s.max_abs_error = std::max(s.max_abs_error, e);
    s.within_5 += e <= 0.05 ? 1 : 0;
    s.within_10 += e <= 0.10 ? 1 : 0;
    ++s.rows;
  };
  for (const auto& row : report.rows) {
    if (row.level != level) continue;
    add(out.front(), row.error);
    auto it = std::find_if(out.begin() + 1, out.end(),
                           [&](const ErrorSummary& s) { return s.group == row.series; });
    if (it == out.end()) {
      out.push_back({.group = row.series});
      it = out.end() - 1;
    }
    add(*it, row.error);
  }
  return out;
}

json to_json(const AccuracyReport& report) {
  json rows = json::array();
  for (const auto& r : report.rows) {
    rows.push_back({{"level", name_of(r.level)},
                    {"id", r.id},
                    {"source", r.source},
                    {"series", r.series},
                    {"device", r.device},
                    {"mapped_to", r.mapped_to},
                    {"quantity", r.quantity},
                    {"published", r.published},
                    {"predicted", r.predicted},
                    {"error", r.error},
                    {"note", r.note},
                    {"peak_memory_fraction", r.peak_memory_fraction},
                    {"bytes", r.bytes},
                    {"experiment", r.experiment}});
  }
  json unexpressed = json::array();
  for (const auto& u : report.unexpressed) {
    unexpressed.push_back(
        {{"level", name_of(u.level)}, {"id", u.id}, {"source", u.source}, {"reason", u.reason}});
  }
  json summary = json::object();
  for (AccuracyLevel level : {AccuracyLevel::e2e, AccuracyLevel::gemm, AccuracyLevel::attention,
                              AccuracyLevel::collective, AccuracyLevel::moe}) {
    json groups = json::array();
    for (const auto& s : summaries(report, level)) {
      groups.push_back({{"group", s.group},
                        {"rows", s.rows},
                        {"mean_abs_error", s.mean_abs_error},
                        {"max_abs_error", s.max_abs_error},
                        {"within_5", s.within_5},
                        {"within_10", s.within_10}});
    }
    summary[std::string(name_of(level))] = groups;
  }
  json others = json::object();
  for (const auto& [category, n] : report.other_categories) others[category] = n;
  return {{"calibration", report.calibration.string()},
          {"cases", report.cases},
          {"bounds",
           {{"e2e_mean_abs_error", kE2eMeanErrorBound},
            {"e2e_max_abs_error", kE2eMaxErrorBound},
            {"kernel_max_abs_error", kKernelMaxError},
            {"collective_max_abs_error_from_1MiB", kCollectiveLargeMaxError},
            {"collective_max_abs_error_below_1MiB", kCollectiveSmallMaxError}}},
          {"rows", rows},
          {"unexpressed", unexpressed},
          {"other_categories", others},
          {"summary", summary}};
}

}  // namespace stratasim::study
