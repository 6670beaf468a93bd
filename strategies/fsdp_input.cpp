#include "strategies/fsdp_input.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <vector>

#include "hw_models/json_depth.hpp"
#include "strategies/foreign_reading.hpp"

namespace stratasim::strategies {

namespace {

using config::ConfigError;
using foreign::closest_mapped;
using foreign::shown;
using nlohmann::json;

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A YAML scalar: true/false, an integer or number, null, or a (quoted) string.
json yaml_scalar(const std::string& text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  const std::string u = upper(text);
  if (u == "TRUE") return true;
  if (u == "FALSE") return false;
  if (u == "NULL" || u == "~" || text.empty()) return nullptr;
  try {
    std::size_t used = 0;
    const long long i = std::stoll(text, &used);
    if (used == text.size()) return i;
    const double d = std::stod(text, &used);
    if (used == text.size()) return d;
  } catch (const std::exception&) {
  }
  return text;
}

// The YAML subset of fsdp configs: nested mappings of scalars.
json parse_yaml(std::string_view text, const std::string& source) {
  json root = json::object();
  std::vector<std::pair<int, json*>> stack = {{-1, &root}};
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const auto hash = line.find(" #");
    if (hash != std::string::npos) line = line.substr(0, hash);
    if (trim(line).empty() || trim(line).front() == '#') continue;
    const int indent = static_cast<int>(line.find_first_not_of(' '));
    const std::string body = trim(line);
    const auto colon = body.find(':');
    if (body.front() == '-' || colon == std::string::npos || colon == 0) {
      throw ConfigError(source, "line " + std::to_string(number),
                        "expected \"key: value\" (the YAML subset of FSDP configs: nested "
                        "mappings of scalars), got \"" +
                            body + "\"");
    }
    while (stack.back().first >= indent) stack.pop_back();
    const std::string key = trim(body.substr(0, colon));
    const std::string value = trim(body.substr(colon + 1));
    json& parent = *stack.back().second;
    if (value.empty()) {
      parent[key] = json::object();
      stack.push_back({indent, &parent[key]});
    } else {
      parent[key] = yaml_scalar(value);
    }
  }
  return root;
}

class FsdpReader : foreign::Reader {
 public:
  explicit FsdpReader(std::string source) : Reader(std::move(source)) {}

  ForeignInput read(const json& file) {
    if (!file.is_object()) fail("", "expected an FSDP config object");
    const json* config = &file;
    std::string at;
    if (auto it = file.find("fsdp_config"); it != file.end()) {
      if (!it->is_object()) fail("fsdp_config", "expected an object, got " + shown(*it));
      config = &*it;
      at = "fsdp_config";
      read_accelerate_fp8(file);
    }
    set("training.framework", "fsdp", at.empty() ? "file" : at);
    for (const auto& [raw, value] : config->items()) {
      std::string key = raw;
      if (key.starts_with("fsdp_")) key = key.substr(5);  // Accelerate's prefix
      read_key(key, value, config::join_path(at, raw));
    }
    return std::move(out_);
  }

 private:
  std::string name(const json& v, const std::string& at, const std::vector<std::string>& options) {
    if (!v.is_string()) fail(at, "expected a string, got " + shown(v));
    const std::string u = upper(v.get<std::string>());
    if (std::find(options.begin(), options.end(), u) == options.end()) {
      std::string list;
      for (const auto& o : options) list += (list.empty() ? "" : ", ") + o;
      const std::string hint = config::closest_match(u, options);
      fail(at, "expected one of " + list + ", got " + shown(v) +
                   (hint.empty() ? "" : " (did you mean " + hint + "?)"));
    }
    return u;
  }
  std::string dtype(const json& v, const std::string& at) {
    const std::string u = name(
        v, at,
        {"BF16", "BFLOAT16", "AMP_BF16", "FP16", "FLOAT16", "HALF", "AMP_FP16", "FP32", "FLOAT32"});
    if (u.find("BF") != std::string::npos) return "bf16";
    if (u == "FP32" || u == "FLOAT32") return "fp32";
    return "fp16";
  }

  // An Accelerate config's mixed_precision "fp8" with its fp8_config (Accelerate's FP8 docs:
  // backend TE = Transformer Engine's delayed scaling, AO = torchao's float8 linears, tensorwise
  // current scaling; fp8_format HYBRID / E4M3; amax_history_length, amax_compute_algorithm):
  // training.dtype fp8 and training.fp8 (docs/precision.md). Other mixed_precision values are
  // left to the experiment, as before.
  void read_accelerate_fp8(const json& file) {
    const auto mp = file.find("mixed_precision");
    if (mp == file.end() || !mp->is_string() || upper(mp->get<std::string>()) != "FP8") return;
    set("training.dtype", "fp8", "mixed_precision");
    const auto cfg = file.find("fp8_config");
    if (cfg == file.end() || cfg->is_null()) return;
    if (!cfg->is_object()) fail("fp8_config", "expected an object, got " + shown(*cfg));
    for (const auto& [k, v] : cfg->items()) {
      const std::string at = config::join_path("fp8_config", k);
      if (k == "backend") {
        const std::string b = name(v, at, {"TE", "AO", "MSAMP"});
        if (b == "MSAMP") fail(at, "MS-AMP's FP8 is not modelled (TE or AO are)");
        set("training.fp8.recipe", b == "AO" ? "current" : "delayed", at);
      } else if (k == "fp8_format") {
        set("training.fp8.format", name(v, at, {"HYBRID", "E4M3"}) == "E4M3" ? "e4m3" : "hybrid",
            at);
      } else if (k == "amax_history_length" || k == "amax_history_len") {
        if (!v.is_number_integer()) fail(at, "expected an integer, got " + shown(v));
        set("training.fp8.amax_history_len", v, at);
      } else if (k == "amax_compute_algorithm" || k == "amax_compute_algo") {
        set("training.fp8.amax_compute_algo",
            name(v, at, {"MAX", "MOST_RECENT"}) == "MAX" ? "max" : "most_recent", at);
      } else {
        note("fp8_config." + k + " is not modelled");
      }
    }
  }

  void read_precision(const json& v, const std::string& at) {
    if (v.is_object()) {
      json out = json::object();
      for (const auto& [k, d] : v.items()) {
        const std::string path = config::join_path(at, k);
        if (k != "param_dtype" && k != "reduce_dtype" && k != "buffer_dtype") {
          const std::string hint =
              config::closest_match(k, {"param_dtype", "reduce_dtype", "buffer_dtype"});
          fail(path,
               "unknown key '" + k + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
        }
        if (!d.is_null()) out[k] = dtype(d, path);
      }
      set("training.fsdp.mixed_precision", out, at);
      return;
    }
    set("training.fsdp.mixed_precision", name(v, at, {"DEFAULT", "PURE", "FULL"}), at);
  }

  void read_key(const std::string& key, const json& v, const std::string& at) {
    static const std::vector<std::string> mapped = {
        "sharding_strategy",     "mixed_precision",  "activation_checkpointing",
        "limit_all_gathers",     "forward_prefetch", "backward_prefetch",
        "auto_wrap_policy",      "cpu_offload",      "offload_params",
        "activation_cpu_offload"};
    static const std::vector<std::string> ignored = {"verbose",
                                                     "use_orig_params",
                                                     "sync_module_states",
                                                     "state_dict_type",
                                                     "activation_checkpointing_reentrant",
                                                     "load_monolith_rank0_only",
                                                     "sharded_ckpt_prefix_dir",
                                                     "cpu_ram_efficient_loading",
                                                     "transformer_layer_cls_to_wrap",
                                                     "backward_prefetch_limit",
                                                     "forward_prefetch_limit",
                                                     "keep_low_precision_grads",
                                                     "version",
                                                     "process_group",
                                                     "ignored_modules",
                                                     "min_num_params",
                                                     "data_parallel_shard_degree",
                                                     "data_parallel_replicate_degree",
                                                     "load_planner",
                                                     "save_planner",
                                                     "te_checkpoint_wrapper",
                                                     "te_shard_fp8_weight"};
    if (v.is_null()) return;
    if (key == "sharding_strategy") {
      std::string s;
      if (v.is_number_integer() && v.get<int>() >= 1 && v.get<int>() <= 4) {
        static const char* kAccelerate[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                            "HYBRID_SHARD"};
        s = kAccelerate[v.get<int>() - 1];
      } else {
        s = name(v, at, {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"});
      }
      set("training.fsdp.sharding_strategy", s, at);
    } else if (key == "mixed_precision") {
      read_precision(v, at);
    } else if (key == "activation_checkpointing") {
      set("parallelism.recompute", boolean(v, at) ? "full" : "none", at);
    } else if (key == "limit_all_gathers" || key == "forward_prefetch") {
      set("training.fsdp." + key, boolean(v, at), at);
    } else if (key == "backward_prefetch") {
      std::string p = name(v, at, {"BACKWARD_PRE", "BACKWARD_POST", "NONE", "NO_PREFETCH"});
      set("training.fsdp.backward_prefetch", p == "NO_PREFETCH" ? "NONE" : p, at);
    } else if (key == "auto_wrap_policy") {
      const std::string p = name(v, at, {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"});
      set("training.fsdp.wrap", p == "NO_WRAP" ? "model" : "block", at);
      if (p == "SIZE_BASED_WRAP") note(at + " SIZE_BASED_WRAP is modelled as one unit per block");
    } else if (key == "cpu_offload" || key == "offload_params") {
      if (boolean(v, at)) fail(at, "FSDP's CPU offload of parameters is not modelled");
    } else if (key == "activation_cpu_offload") {
      if (boolean(v, at)) note(at + " (activation CPU offload) is not modelled");
    } else if (std::find(ignored.begin(), ignored.end(), key) == ignored.end()) {
      const std::string typo = closest_mapped(key, mapped);
      if (!typo.empty()) fail(at, "unknown key '" + key + "'; did you mean '" + typo + "'?");
      note("unknown key '" + at + "' ignored");
    }
  }
};

}  // namespace

ForeignInput fsdp_config_from_text(std::string_view text, const std::string& source) {
  const auto start = text.find_first_not_of(" \t\r\n");
  json root;
  if (start != std::string_view::npos && text[start] == '{') {
    try {
      root = config::parse_json_depth_bounded(text, source);
    } catch (const json::parse_error& e) {
      throw ConfigError(source, "", std::string("invalid JSON: ") + e.what());
    }
  } else {
    root = parse_yaml(text, source);
  }
  return FsdpReader(source).read(root);
}

ForeignInput load_fsdp_config(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    throw ConfigError(file.string(), "",
                      std::filesystem::exists(file, ec) ? "cannot be read" : "no such file");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return fsdp_config_from_text(buffer.str(), file.string());
}

}  // namespace stratasim::strategies
