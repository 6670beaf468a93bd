// An FSDP config as users already have it (`--fsdp FILE`): llm-foundry / Composer's
// `fsdp_config` (a YAML block or JSON object: sharding_strategy, mixed_precision PURE / DEFAULT /
// FULL or {param_dtype, reduce_dtype, buffer_dtype}, activation_checkpointing,
// limit_all_gathers, forward_prefetch, backward_prefetch, verbose, ...) or Hugging Face
// Accelerate's (`fsdp_config:` with fsdp_-prefixed keys: fsdp_sharding_strategy as a name or
// Accelerate's number 1-4, fsdp_backward_prefetch BACKWARD_PRE / BACKWARD_POST / NO_PREFETCH,
// fsdp_auto_wrap_policy, fsdp_activation_checkpointing, ...). docs/inputs.md has the key table.
//
// The file is JSON when it starts with '{', else the YAML subset these configs use: "key: value"
// lines, nesting by indentation, '#' comments, scalars (true/false, numbers, bare or quoted
// strings); anything else (lists, anchors, multi-line strings) is an error naming the line. A
// top-level `fsdp_config` (llm-foundry's run yaml, Accelerate's config) is read as the config.
//
// Mapped keys become overrides of training.fsdp.* (strategies/fsdp.hpp), parallelism.recompute
// (activation_checkpointing) and training.framework "fsdp". As with --deepspeed: an unknown key
// within two edits of a mapped one is an error ("did you mean"), a farther one a note; a bad
// value is an error naming the file and the key's path; settings not modelled (FSDP's CPU
// offload: an error; activation CPU offload, size-based wrapping: notes) say so.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "strategies/foreign_inputs.hpp"

namespace stratasim::strategies {

/// The FSDP config at `file`; errors (config::ConfigError) name the file and the key's path.
ForeignInput load_fsdp_config(const std::filesystem::path& file);
/// The same from its text; `source` names it in errors and origins.
ForeignInput fsdp_config_from_text(std::string_view text, const std::string& source);

}  // namespace stratasim::strategies
