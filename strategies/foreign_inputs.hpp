// Inputs users already have, mapped onto an experiment: a DeepSpeed config JSON, a Megatron-LM
// argument string and a Hugging Face config.json (docs/inputs.md has the key tables).
//
// DeepSpeed and Megatron inputs become Overrides of the experiment document, applied like the
// --tp or --set flags (each with an origin that names the file or argument), plus notes.
// A Hugging Face config.json is a model: read_experiment converts it wherever a model file is
// named ("model" in an experiment, --model on the command line).
//
// What is an error and what is a note:
// - ConfigError (the run stops, exit 2): a malformed file, a value of the wrong type or out of
//   range, settings that contradict each other (train_batch_size != micro x accumulation x dp,
//   --bf16 with --fp16), an unknown key or argument whose closest known name is one that is
//   mapped (probably a typo that would silently change the result), and settings that would make
//   the simulated strategy a different one (--context-parallel-size > 1, experts).
// - Note (a "note:" line on stderr, the run goes on): "auto" values kept from the experiment,
//   settings that are accepted but not modelled (ZeRO-3 prefetch tuning, Mistral's sliding
//   window, GPT-NeoX's parallel residual, an optimizer other than Adam), and unknown keys or
//   arguments that are not close to a mapped one (ignored).
// Known keys that do not change what is simulated (learning rates, logging, data paths) are
// accepted silently.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/config_reader.hpp"
#include "strategies/experiment.hpp"
#include "strategies/model.hpp"

namespace stratasim::strategies {

/// A foreign input as overrides of the experiment document (applied in order, before the
/// command line's own flags) and the notes to show the user.
struct ForeignInput {
  std::vector<Override> overrides;
  std::vector<std::string> notes;  // each names its source: "ds.json: optimizer.type ..."
};

/// A DeepSpeed config (ds_config.json) read from `file`; errors name the file and the JSON path.
ForeignInput load_deepspeed(const std::filesystem::path& file);
/// The same from the text of one; `source` names it in errors and origins.
ForeignInput deepspeed_from_text(std::string_view text, const std::string& source);

/// Megatron-LM arguments ("--tensor-model-parallel-size 8 --num-layers 96 ..."), split as a
/// shell would (quotes and backslashes respected); `source` names them in errors.
ForeignInput megatron_from_args(std::string_view args,
                                const std::string& source = "--megatron-args");
/// Splits `text` into words as a POSIX shell does (single quotes, double quotes with backslash
/// escapes, backslashes); an unterminated quote is a ConfigError naming `source` and the byte
/// offset.
std::vector<std::string> split_shell_words(std::string_view text, const std::string& source);

/// Whether `object` is a Hugging Face config.json: it has "model_type" or "architectures".
bool is_hf_config(const nlohmann::json& object);
/// The model_type values read (docs/inputs.md has what each becomes).
inline constexpr std::string_view kHfModelTypes[] = {
    "llama",  "mistral",   "gpt2",     "gpt_neox",  "mixtral",     "deepseek_v2", "deepseek_v3",
    "qwen2",  "qwen2_moe", "qwen3",    "qwen3_moe", "gemma",       "gemma2",      "gemma3_text",
    "gemma3", "phi3",      "nemotron", "llama4",    "llama4_text", "bert"};

/// If the value at `path` of `doc` is a Hugging Face config.json, replaces it with the
/// equivalent stratasim model object (strategies/model.hpp keys), appending notes on what is
/// accepted but not modelled; returns whether it did. Errors name the config.json and its key.
bool convert_hf_model(config::Document& doc, const std::string& path,
                      std::vector<std::string>& notes);
/// A Hugging Face config.json from text, read as a model (for tests and the fuzz target).
TransformerModel hf_model_from_text(std::string_view text, const std::string& source,
                                    std::vector<std::string>& notes);

/// Where loaders send notes as they arise (read_experiment's Hugging Face notes): the CLI
/// installs a printer; by default notes are only kept (Experiment::notes). Thread-safe.
using NoteSink = std::function<void(const std::string&)>;
void set_note_sink(NoteSink sink);
void report_note(const std::string& note);

}  // namespace stratasim::strategies
