// MLCommons Chakra execution traces (ET) in and out: import as a Program, export any Program.
//
// A Chakra trace is one file per rank, "<prefix>.<rank>.et": varint32-length-delimited protobuf
// messages (traces/et_def.proto), a GlobalMetadata first, then Nodes. Its JSON form (what
// Chakra's jsonizer writes) is "<prefix>.<rank>.json": the same messages in protobuf's JSON
// mapping, one JSON object after another. Communicator groups come from
// "<prefix>.comm_groups.json" in ASTRA-sim's format, {"<pg_name>": [ranks...], ...}.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strategies/program.hpp"
#include "traces/import.hpp"
#include "traces/timeline.hpp"

namespace stratasim::traces {

/// Imports a Chakra trace: a folder or a prefix whose per-rank files are "<prefix>.<rank>.et"
/// (protobuf) or "<prefix>.<rank>.json" (Chakra's JSON form). Throws TraceError.
ImportedTrace import_chakra(const std::filesystem::path& path);

/// The same from bytes in memory (the fuzz targets' entry point): `per_rank[r]` is rank r's
/// file, `comm_groups` the comm-group file's text when there is one; `source` names the trace
/// in messages. Throws TraceError only.
ImportedTrace import_chakra_buffers(const std::vector<std::string>& per_rank,
                                    const std::optional<std::string>& comm_groups,
                                    std::string_view source, bool json_form);

struct ChakraExportOptions {
  /// Write Chakra's JSON form ("<prefix>.<rank>.json") instead of protobuf ("<prefix>.<rank>.et").
  bool json_form = false;
  /// A run of the program (same op ids): fills each node's start_time_micros and
  /// duration_micros, which tools that replay measured durations use.
  const Timeline* timeline = nullptr;
  /// Order each rank's communication nodes (collectives, sends, receives) for one communication
  /// queue: ctrl_deps chain them in the order the timeline started them (ties: earlier end, then
  /// op id). ASTRA-sim runs one communication node at a time per rank, so the per-stream order
  /// alone, which lets streams interleave, can deadlock there. Needs `timeline` (a completed
  /// run of the same program); std::invalid_argument without one.
  bool single_comm_queue = false;
  /// The cluster the program was made for (a catalog name or a path), recorded in every rank's
  /// GlobalMetadata ("stratasim.cluster") so that a replay finds it (ImportedTrace::cluster);
  /// empty: none recorded.
  std::string cluster = {};
};

/// Writes `program` as a Chakra trace: "<prefix>.<rank>.et" (or ".json") for every rank and
/// "<prefix>.comm_groups.json". Node ids are op indices within their rank; data_deps are the
/// op's dependencies; ctrl_deps the previous op on the same stream, so that a dependency-only
/// consumer such as ASTRA-sim keeps each stream's order. Attributes named "stratasim.*" carry
/// what Chakra has no field for (kernels, stream, phase, microbatch, layers, memory effects,
/// initial memory, group names) so that import_chakra restores the Program exactly. ASTRA-sim's
/// conventions (docs/traces.md): communicator group ids from 1 (0 is reserved), an all-gather's
/// comm_size is one rank's input, num_ops and tensor_size from the kernels' FLOPs and bytes
/// (strategies/kernel_bytes.hpp), lone host <-> device copies as MEM_LOAD_NODE/MEM_STORE_NODE.
/// Files are written under temporary names and renamed into place when all are complete; bytes are
/// deterministic. A mirrored Program (data-parallel mirroring) is refused with
/// std::invalid_argument: lower without mirroring to export. Throws std::runtime_error when a
/// file cannot be written.
void write_chakra(const std::filesystem::path& prefix, const strategies::Program& program,
                  const ChakraExportOptions& options = {});

}  // namespace stratasim::traces
