// Validation: a predicted run (the simulator's Timeline) against a measured one (exec/'s) of the
// same Program, aligned op by op (both Timelines index spans by op id). `stratasim validate`
// prints and writes it.
//
// Errors are signed: (predicted - measured) / measured, so -10% means the simulator predicted
// 10% less time than the run took. For a class, the error is that of the summed times of its
// members; the mean absolute error is over the members one by one (a class can be right on
// average and wrong op by op).
//
// Classes: every kernel of a compute op by its kind (gemm, attention, elementwise, optimizer,
// copy, measured, roofline), each collective kind by name (all-reduce, ...), and p2p (sends and
// receives). Kernel times come from outside (the cost model's per-kernel prediction, the
// executor's per-kernel events); communication times are the ops' spans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::traces {

/// How long one kernel of a compute op took (or is predicted to take).
struct KernelDuration {
  strategies::OpId op = 0;
  std::uint32_t index = 0;  // position in the op's kernel list
  Time duration;
};

struct ValidationRow {
  std::string name;        // "gemm", "all-reduce", "stage 1", "iteration"
  std::int64_t count = 0;  // kernels or ops compared
  double predicted_s = 0;
  double measured_s = 0;
  double error = 0;           // (predicted - measured) / measured; 0 when measured is 0
  double mean_abs_error = 0;  // over the members; equal to |error| for a single figure
};

/// One compared item, for plots (validation_ops.csv).
struct ValidationItem {
  strategies::OpId op = 0;
  std::int32_t kernel = -1;  // index within the op, -1 for communication ops
  std::int32_t rank = 0;
  std::string cls;
  std::string label;
  double predicted_s = 0;
  double measured_s = 0;
};

struct MemoryComparison {
  std::int32_t rank = 0;  // the rank of the largest measured peak
  Bytes predicted;        // that rank's predicted device peak
  Bytes measured;
  double error = 0;
};

struct Validation {
  std::vector<ValidationRow> classes;  // in a fixed order, classes without members left out
  std::vector<ValidationRow> stages;   // per pipeline stage: the longest rank span of the stage
  ValidationRow iteration;             // latest op end of either run
  MemoryComparison memory;
  std::vector<ValidationItem> items;
};

/// Compares the runs. `stage_of_rank` gives each rank's pipeline stage. Kernel durations may
/// come in any order; a kernel missing on either side is left out.
Validation compare(const strategies::Program& program, const Timeline& predicted,
                   const Timeline& measured, const std::vector<KernelDuration>& predicted_kernels,
                   const std::vector<KernelDuration>& measured_kernels,
                   const std::vector<int>& stage_of_rank);

/// validation.json: {"classes": [rows], "stages": [rows], "iteration": row, "memory": {...}}
/// with rows {name, count, predicted_s, measured_s, error, mean_abs_error}.
nlohmann::json to_json(const Validation& v);
/// The table `stratasim validate` prints.
void print_validation(std::ostream& out, const Validation& v);
/// validation_ops.csv: op,kernel,rank,class,label,predicted_s,measured_s.
void write_validation_csv(std::ostream& out, const Validation& v);

}  // namespace stratasim::traces
