// PyTorch profiler / Kineto Chrome-trace JSON in: import as a Program. docs/traces.md ("Kineto
// in") is the user's page; the semantics assumed, in short:
//  - Steps. Each host `ProfilerStep#N` span (torch.profiler's schedule) is one iteration. One
//    step is replayed: the one asked for (KinetoOptions::step), else the median one by measured
//    duration (the lower median: steady state, not the warm-up; the first step left out when
//    three or more have GPU work). A GPU event belongs to the step in which it was launched (its
//    "correlation" to a cuda_runtime / cuda_driver / hip_runtime launch call), else in which it
//    started. A step's time runs from where the previous step's ended (or its span's start, if
//    later) to the later of its span's end and the end of its GPU events; the replay is of every
//    GPU event that started in that time. A trace without steps is one iteration, from its
//    first GPU event to its last.
//  - Host time. Time within the step where no kernel, memcpy or memset runs on the rank
//    (dataloader, CPU operators, synchronisation, launch latency) becomes measured ops on the
//    host stream, in order, between the GPU work around them: the replayed step keeps it.
//  - Ranks. One file per rank. When the files are fewer than distributedInfo.world_size (one
//    rank of a multi-rank job), the ranks given are replayed alone and their NCCL kernels keep
//    their measured durations (the peers are absent): communication is taken as measured.
//  - Groups. From the NCCL kernels' record_param_comms args ("Process Group Name",
//    "Process Group Description", "Process Group Ranks"); classified as data parallel by
//    description (or a user's --dp-groups pattern), PyTorch's default group of the whole
//    world being data parallel (DDP's and FSDP's gradient collectives run on it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "traces/import.hpp"

namespace stratasim::traces {

struct KinetoOptions {
  /// The ProfilerStep#N to replay (N as the trace numbers it); none: the median step.
  std::optional<std::int64_t> step;
  /// Replay every step of the trace back to back (from the first step's start to the last's
  /// end) instead of one.
  bool all_steps = false;
  /// A regular expression over group names that decides which groups are data parallel
  /// (strategies::RetargetOptions::dp_groups' semantics); empty: the importer's rule.
  std::string dp_groups;
};

/// Imports Kineto traces: one JSON file per rank (a folder of them, or one file for a single
/// rank). Throws TraceError.
ImportedTrace import_kineto(const std::filesystem::path& path, const KinetoOptions& options = {});

/// A Kineto trace file in memory: its name (for messages, and the rank when the file does not
/// say) and its text.
struct KinetoFile {
  std::string name;
  std::string text;
};

/// The same from texts in memory (the fuzz target's entry point). Each file's rank is its
/// "distributedInfo": {"rank"}, else a number after "rank" in its name, else (one file) 0.
/// Throws TraceError only.
ImportedTrace import_kineto_texts(const std::vector<KinetoFile>& files,
                                  const KinetoOptions& options = {});

}  // namespace stratasim::traces
