// Pieces every stratasim command shares: the experiment flags and the errors that map to exit
// codes.
#include "cli/common.hpp"

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>

#include <unistd.h>

#include "strategies/foreign_inputs.hpp"
#include "strategies/fsdp_input.hpp"

namespace stratasim::cli {

namespace fs = std::filesystem;

std::vector<strategies::Override> overrides_of(const SimulateArgs& a) {
  std::vector<strategies::Override> o;
  auto flag = [&](const char* name, const char* path, nlohmann::json value) {
    o.push_back({path, value, "command line (" + std::string(name) + " " + value.dump() + ")"});
  };
  // Foreign inputs first: the experiment's own flags below override what they set.
  if (a.model) {
    o.push_back(
        {"model", resolve_model(*a.model).string(), "command line (--model " + *a.model + ")"});
  }
  auto foreign = [&](const strategies::ForeignInput& input) {
    o.insert(o.end(), input.overrides.begin(), input.overrides.end());
    for (const auto& note : input.notes) strategies::report_note(note);
  };
  if (a.deepspeed) foreign(strategies::load_deepspeed(*a.deepspeed));
  if (a.megatron_args) foreign(strategies::megatron_from_args(*a.megatron_args));
  if (a.fsdp) foreign(strategies::load_fsdp_config(*a.fsdp));
  if (a.tp) flag("--tp", "parallelism.tp", *a.tp);
  if (a.pp) flag("--pp", "parallelism.pp", *a.pp);
  if (a.dp) {
    flag("--dp", "parallelism.dp", *a.dp);
  } else if (a.tp || a.pp) {
    // A new tp or pp with no --dp: derive dp from the cluster again.
    o.push_back({"parallelism.dp", nullptr, "command line (--tp/--pp without --dp)"});
  }
  if (a.micro_batch) flag("--micro-batch", "parallelism.micro_batch", *a.micro_batch);
  if (a.global_batch) flag("--global-batch", "training.global_batch", *a.global_batch);
  if (a.seq_len) flag("--seq-len", "training.seq_len", *a.seq_len);
  if (a.schedule) flag("--schedule", "parallelism.schedule", *a.schedule);
  if (a.virtual_stages) flag("--virtual-stages", "parallelism.virtual_stages", *a.virtual_stages);
  if (a.partition) {  // "balanced", "even" or "9,8,8,7"
    nlohmann::json value = *a.partition;
    if (a.partition->find(',') != std::string::npos ||
        a.partition->find_first_not_of("0123456789") == std::string::npos) {
      value = nlohmann::json::array();
      std::stringstream items(*a.partition);
      std::string item;
      while (std::getline(items, item, ',')) value.push_back(config::parse_override_value(item));
    }
    o.push_back(
        {"parallelism.partition", value, "command line (--partition " + *a.partition + ")"});
  }
  if (a.sequence_parallel) flag("--sequence-parallel", "parallelism.sequence_parallel", true);
  if (a.zero) flag("--zero", "parallelism.zero", *a.zero);
  if (a.tp_mode) flag("--tp-mode", "parallelism.tp_mode", *a.tp_mode);
  if (a.grad_compression) {
    flag("--grad-compression", "parallelism.grad_compression", *a.grad_compression);
  }
  if (a.recompute) flag("--recompute", "parallelism.recompute", *a.recompute);
  if (a.recompute_num_layers) {
    flag("--recompute-num-layers", "parallelism.recompute_num_layers", *a.recompute_num_layers);
  }
  if (a.offload) {  // "optimizer,params" -> ["optimizer", "params"]
    nlohmann::json list = nlohmann::json::array();
    std::stringstream items(*a.offload);
    std::string item;
    while (std::getline(items, item, ',')) list.push_back(item);
    o.push_back({"parallelism.offload", list, "command line (--offload " + *a.offload + ")"});
  }
  for (const auto& s : a.sets) o.push_back(study::parse_set(s));
  return o;
}

// Fails early (before any work) when --out cannot become a folder: it, or its nearest existing
// ancestor, is not a directory. Missing folders are created when the outputs are written.
void check_out_dir(const std::string& out) {
  if (out.empty()) return;
  std::error_code ec;
  fs::path dir = fs::absolute(fs::path(out), ec).lexically_normal();
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw BadInput("--out " + out + ": exists and is not a directory");
  }
  for (fs::path p = dir.parent_path(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec)) {
        throw BadInput("--out " + out + ": " + p.string() + " is not a directory");
      }
      break;
    }
    if (p == p.parent_path()) break;
  }
  // Probe that it can be written (a folder under /proc, a read-only file system): create the
  // missing folders and a file in them, then remove what the probe made.
  std::vector<fs::path> made;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    made.push_back(p);
    if (p == p.parent_path()) break;
  }
  const auto cleanup = [&] {
    for (const auto& p : made) fs::remove(p, ec);  // deepest first
  };
  if (!fs::create_directories(dir, ec) && ec) {
    const std::string why = ec.message();
    cleanup();
    throw BadInput("--out " + out + ": cannot create the folder (" + why + ")");
  }
  const fs::path probe = dir / (".stratasim-probe-" + std::to_string(::getpid()));
  const bool writable = static_cast<bool>(std::ofstream(probe));
  fs::remove(probe, ec);
  cleanup();
  if (!writable) throw BadInput("--out " + out + ": cannot write files in it");
}

CLI::Validator integer_at_least(std::int64_t min, std::int64_t max) {
  const std::string expected =
      min == 1 ? "a positive integer" : "an integer of at least " + std::to_string(min);
  return CLI::Validator(
      [min, max, expected](std::string& value) -> std::string {
        std::int64_t n = 0;
        const char* first = value.data();
        const char* last = first + value.size();
        if (first != last && *first == '+') ++first;
        auto [end, ec] = std::from_chars(first, last, n);
        const bool whole = ec == std::errc{} && end == last;
        if (whole && n >= min && n <= max) return "";
        const std::string shown = value.empty()       ? "nothing"
                                  : value.size() > 40 ? value.substr(0, 40) + "..."
                                                      : value;
        // Too large (or beyond int64): say the upper bound too.
        const bool too_large = (whole && n > max) || ec == std::errc::result_out_of_range;
        return "expected " + expected +
               (too_large && max < std::numeric_limits<std::int64_t>::max() && value.front() != '-'
                    ? " of at most " + std::to_string(max)
                    : std::string()) +
               ", got " + shown;
      },
      expected);
}

CLI::Validator positive_integer() {
  return integer_at_least(1);
}

CLI::Validator non_empty(const std::string& expected) {
  return CLI::Validator(
      [expected](std::string& value) -> std::string {
        return value.empty() ? "expected " + expected + ", got nothing" : "";
      },
      expected);
}

// {0,1,2,3,8,9} -> "0-3,8-9".
std::string ranges_text(const std::vector<std::int32_t>& devices) {
  std::string out;
  for (std::size_t i = 0; i < devices.size();) {
    std::size_t j = i;
    while (j + 1 < devices.size() && devices[j + 1] == devices[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(devices[i]);
    if (j > i) out += "-" + std::to_string(devices[j]);
    i = j + 1;
  }
  return out;
}

namespace {
std::atomic<bool> notes_quiet = false;   // --quiet given
std::atomic<bool> notes_hidden = false;  // --no-notes given
}  // namespace

void print_note(const std::string& note) {
  if (notes_hidden) return;
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard lock(mutex);
  if (seen.insert(note).second) std::cerr << "note: " << note << "\n";
}

void add_experiment_options(CLI::App* cmd, SimulateArgs& sim_args) {
  cmd->add_option("experiment", sim_args.experiment,
                  "Experiment JSON file, or the name of one in configs/experiments")
      ->required();
  cmd->add_option("--tp", sim_args.tp, "Tensor-parallel degree")->check(positive_integer());
  cmd->add_option("--pp", sim_args.pp, "Pipeline stages")->check(positive_integer());
  cmd->add_option("--dp", sim_args.dp, "Data-parallel degree (default: the remaining devices)")
      ->check(positive_integer());
  cmd->add_option("--micro-batch", sim_args.micro_batch, "Samples per microbatch")
      ->check(positive_integer());
  cmd->add_option("--global-batch", sim_args.global_batch, "Samples per iteration")
      ->check(integer_at_least(1, std::numeric_limits<std::int64_t>::max()));
  cmd->add_option("--seq-len", sim_args.seq_len, "Tokens per sample")->check(positive_integer());
  cmd->add_option("--schedule", sim_args.schedule,
                  "Pipeline schedule: gpipe, 1f1b, interleaved, pipedream-2bw, merak-scp, zb-h1, "
                  "zb-h2, zb-v, chimera, terapipe or dualpipe (docs/schedules.md)");
  cmd->add_option("--virtual-stages", sim_args.virtual_stages,
                  "Model chunks per device with the interleaved schedule")
      ->check(positive_integer());
  cmd->add_option("--partition", sim_args.partition,
                  "Layers per stage: even, balanced (BaPipe) or a list like 9,8,8,7");
  cmd->add_flag("--sequence-parallel", sim_args.sequence_parallel, "Megatron sequence parallelism");
  cmd->add_option("--zero", sim_args.zero, "ZeRO stage 0-3 (DeepSpeed)");
  cmd->add_option("--tp-mode", sim_args.tp_mode,
                  "Tensor parallelism: 1d (Megatron), 2d, 2.5d or 3d (Colossal-AI; "
                  "docs/tensor-parallelism.md)");
  cmd->add_option("--grad-compression", sim_args.grad_compression,
                  "Data-parallel gradients: none, fp16, int8, topk or s2-reducer "
                  "(docs/grad-compression.md)");
  cmd->add_option("--recompute", sim_args.recompute,
                  "Activation recomputation: none, full, selective or stage_aware");
  cmd->add_option("--recompute-num-layers", sim_args.recompute_num_layers,
                  "Layers per checkpoint (uniform) or recomputed per stage (block)");
  cmd->add_option("--offload", sim_args.offload,
                  "Offload to the host: optimizer, params, nvme, activations (comma-separated)");
  cmd->add_option("--set", sim_args.sets,
                  "Override any config value: dotted.key=value (repeatable), e.g. "
                  "training.seq_len=4096 or cluster.inter_node.bandwidth=\"400 Gb/s\"");
  cmd->add_flag("--quiet", sim_args.quiet,
                "Print nothing on success: neither the report nor the notes (--no-notes hides "
                "only the notes)");
  cmd->add_flag("--exact", sim_args.exact,
                "Simulate every data-parallel replica instead of one mirrored for all (the "
                "report is the same; slower; traces then cover every rank)");
  // Last: it finds the --quiet above.
  add_foreign_input_options(cmd, sim_args);
}

void add_max_memory_option(CLI::App* cmd, SimulateArgs& sim_args) {
  cmd->add_option("--max-memory", sim_args.max_memory,
                  "Host memory the simulation may use, e.g. \"4 GiB\" (default: the machine's "
                  "available memory; \"0 B\": no check). A run estimated to need more stops "
                  "at once with exit 2 and what would make it fit")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            try {
              (void)parse_bytes(value);
              return "";
            } catch (const std::exception& e) {
              return e.what();
            }
          },
          "SIZE"));
}

std::optional<Bytes> max_memory_of(const SimulateArgs& args) {
  if (!args.max_memory) return std::nullopt;
  return parse_bytes(*args.max_memory);
}

void add_foreign_input_options(CLI::App* cmd, SimulateArgs& sim_args) {
  // Notes of the loaders (DeepSpeed, Megatron, Hugging Face inputs) on stderr, unless the
  // command's --quiet is given (whichever command it is: several fill SimulateArgs of their own).
  strategies::set_note_sink([](const std::string& note) {
    if (!notes_quiet) print_note(note);
  });
  if (CLI::Option* quiet = cmd->get_option_no_throw("--quiet")) {
    quiet->each([](const std::string& value) { notes_quiet = value != "false" && value != "0"; });
  }
  cmd->add_flag_callback(
      "--no-notes", [] { notes_hidden = true; },
      "Hide the notes (\"note: ...\" on stderr: values kept, settings not modelled); the report "
      "is printed");
  cmd->add_option("--model", sim_args.model,
                  "Model file instead of the experiment's: a stratasim model JSON or a Hugging "
                  "Face config.json (llama, mistral, gpt2, gpt_neox), by path or catalog name");
  cmd->add_option("--deepspeed", sim_args.deepspeed,
                  "DeepSpeed config JSON: ZeRO stage, offload, micro-batch, gradient "
                  "accumulation, precision (docs/inputs.md)");
  cmd->add_option("--fsdp", sim_args.fsdp,
                  "PyTorch FSDP config (llm-foundry's fsdp_config or Accelerate's, YAML or JSON): "
                  "sharding, prefetch, limit_all_gathers, mixed precision (docs/inputs.md)");
  cmd->add_option("--megatron-args", sim_args.megatron_args,
                  "Megatron-LM arguments in one string, e.g. \"--tensor-model-parallel-size 8 "
                  "--num-layers 96\" (docs/inputs.md)");
}

}  // namespace stratasim::cli
