// Published cluster traces as cluster-simulator workloads (cluster/trace.hpp's JobTrace), and a
// generator of Philly-like and Helios-like traces.
//
// Formats (schemas from the traces' published READMEs):
// - philly: Microsoft Philly's `cluster_job_log` (github.com/msr-fiddle/philly-traces, README
//   "Schema"; Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
//   Workloads", USENIX ATC 2019): one JSON array of jobs {"status", "vc", "jobid", "attempts":
//   [{"start_time", "end_time", "detail": [{"ip", "gpus": [...]}]}], "submitted_time", "user"},
//   times "YYYY-MM-DD HH:MM:SS". As the repository's analysis notebook reads it: a job's GPUs are
//   those of its first attempt (the sum of its details' GPU lists), its run time from its first
//   attempt's start to its last attempt's end. Jobs with no attempt or a missing time (the README
//   says both occur) are skipped and counted; every status (Pass, Killed, Failed) is kept: the GPUs
//   were used.
// - helios: SenseTime Helios' `cluster_log.csv` (github.com/S-Lab-System-Group/HeliosData, README
//   "Schema and Description"; Hu et al., "Characterization and Prediction of Deep Learning
//   Workloads in Large-Scale GPU Datacenters", SC 2021): a header line naming job_id, user, vc,
//   gpu_num, cpu_num, node_num, state, submit_time, start_time, end_time, duration (seconds),
//   queue (seconds), in any order; one job per line. Jobs with gpu_num 0 (CPU jobs) or duration 0
//   are skipped and counted; every state is kept.
// Arrival: submission time minus the earliest submission in the file (seconds). Times must lie
// within kMaxTraceSeconds of the first.
//
// Mapping to this project's catalog (a rule, deterministic, documented in docs/cluster.md): a
// GPU count that is not a power of two is rounded up to the next one (the catalog's experiments
// are data-parallel: dp must divide their batch); then, by GPUs g and run time d:
//   g <= 2, d < 2 h        lstm-2x1024-a100-8         (a 2-layer LSTM language model)
//   g <= 2, d >= 2 h       lstm-gnmt-8x1024-a100-8    (GNMT's 8-layer LSTM)
//   2 < g <= 8, d < 4 h    lstm-gnmt-8x1024-a100-8
//   otherwise              gpt3-1.7b-a100-8           (a 1.7B GPT)
// every one an 8-GPU A100 experiment of configs/experiments run at g GPUs. The job's samples are
// its run time x the experiment's speed at g GPUs and its base batch (Throughput): the work the
// recorded run did, had it run on this hardware. Elastic bounds (the traces record none; a
// choice): GPUs in [max(1, g / 2), min(2 g, the cluster)], batch in [M0, 4 M0] (M0: the
// experiment's global batch), noise scale phi per experiment (ModelProfile; an assumption of the
// order McCandlish et al. 2018 report for language models, not a measurement).
//
// Errors: study::BadInput "FILE:LINE: FIELD: what was expected" (helios) or "FILE: jobs[i].FIELD:
// ..." (philly: a JSON path) for malformed input, a time that does not parse, a negative run
// time, and a job larger than the cluster (after rounding).
//
// Generator (generate_recorded, write_generated): N jobs with Poisson arrivals (exponential gaps)
// at the rate that offers `load` x the cluster's GPUs on average (or N / `days` per day when days
// is given), GPU counts drawn from a format's mix, run times lognormal (clamped to [60 s, 7 days]).
// The mixes (fractions of jobs by GPUs) and lognormal parameters are this project's approximations
// of the published figures, not their values:
//   philly: the ATC'19 paper's and the trace notebook's buckets (1, 2-4, 5-8, > 8 GPUs; Figure 2,
//     run time per bucket): 1 GPU 0.70, 2 0.10, 4 0.10, 8 0.07, 16 0.02, 32 0.01; run time median
//     1 h, sigma 1.6 (minutes to days);
//   helios: the SC'21 paper's observation that most GPU jobs take one GPU and a few take many:
//     1 GPU 0.60, 2 0.08, 4 0.12, 8 0.15, 16 0.04, 32 0.01; median 30 min, sigma 1.8.
// Counts above the cluster are clamped to it. The RNG is cluster/random.hpp's (seeded: the same
// seed gives the same file, byte for byte); the output is the format's own (philly: a JSON array
// with the recorded run as one attempt on 8-GPU nodes; helios: the CSV with queue 0; jsonl: this
// project's trace with the mapping applied, which needs speeds).
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "cluster/throughput.hpp"
#include "cluster/trace.hpp"

namespace stratasim::cluster {

enum class TraceFormat { jsonl, philly, helios };

/// "jsonl", "philly" or "helios"; anything else throws study::BadInput naming `flag`.
TraceFormat parse_trace_format(const std::string& name, const std::string& flag);

/// One job as a published trace records it (before the mapping).
struct RecordedJob {
  std::string id;
  double submit_s = 0;  // seconds after the file's first submission
  int gpus = 0;
  double run_s = 0;
  int line = 0;       // helios: the CSV line; philly: the index in the array + 1
  std::string where;  // how errors name it: "FILE:LINE" or "FILE: jobs[i]"
};

struct Recorded {
  std::string source;
  std::vector<RecordedJob> jobs;
  int skipped = 0;  // jobs without attempts, times or GPUs
};

Recorded read_philly(std::istream& in, const std::string& source);
Recorded read_helios(std::istream& in, const std::string& source);

/// The catalog experiment, statistical efficiency and bounds of a mapped job.
struct ModelProfile {
  std::string experiment;
  double noise_scale = 0;  // phi, samples
};
/// The mapping rule at the top of this file (g already a power of two).
ModelProfile map_job(int gpus, double run_s);

/// Recorded jobs as simulator jobs (the mapping, samples from `speeds`); a job larger than
/// `cluster_gpus` after rounding, or not runnable at its GPUs, throws study::BadInput naming its
/// line.
JobTrace map_recorded(const Recorded& recorded, int cluster_gpus, const Throughput& speeds);

/// Reads `file` in `format` (jsonl: read_trace) against a cluster of `cluster_gpus`.
JobTrace read_workload(const std::filesystem::path& file, TraceFormat format, int cluster_gpus,
                       const Throughput& speeds);

struct GenerateOptions {
  TraceFormat format = TraceFormat::philly;
  std::string mix = "philly";  // the distributions: philly or helios
  int jobs = 100;
  int gpus = 64;
  double load = 1.0;  // offered GPU demand / the cluster's GPUs
  double days = 0;    // > 0: arrivals at jobs / days instead (the load then follows)
  std::uint64_t seed = 1;
};

/// The generated jobs (ids j0, j1, ...; submit times from 0).
Recorded generate_recorded(const GenerateOptions& options);
/// Writes `options.format` (jsonl needs `speeds` for the mapping) to `out`, with provenance lines
/// where the format allows (jsonl: '#' lines).
void write_generated(std::ostream& out, const GenerateOptions& options, const Throughput& speeds);

}  // namespace stratasim::cluster
