// The Python module's native part (`stratasim._core`), built with pybind11 over the composition
// layer (study/) and the sweep and search (search/): what the CLI computes, callable from
// Python. python/stratasim/__init__.py is the public face: it turns the JSON strings this part
// returns into dicts, rows into pandas DataFrames, and the errors below into Python exceptions.
//
// Errors: config::ConfigError, traces::TraceError and study::BadInput become
// stratasim.BadInput (a ValueError) with the message the CLI prints after "error: ";
// study::InvalidProgram and a simulation that does not complete become
// stratasim.SimulationFailed (a RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cluster/simulator.hpp"
#include "cluster/workload.hpp"
#include "hw_models/config_reader.hpp"
#include "hw_models/profile.hpp"
#include "search/search.hpp"
#include "search/sweep.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"
#include "study/study.hpp"
#include "traces/export.hpp"
#include "traces/import.hpp"
#include "traces/report.hpp"

namespace py = pybind11;
using namespace stratasim;

namespace {

std::vector<strategies::Override> overrides_of(const std::vector<std::string>& sets) {
  std::vector<strategies::Override> out;
  // Named as the CLI names them ("command line (--set ...)"), so that messages are the same.
  for (const auto& s : sets) out.push_back(study::parse_set(s));
  return out;
}

// An experiment held by Python: loaded once, simulated as often as asked.
struct PyExperiment {
  strategies::Experiment experiment;
};

PyExperiment load(const std::string& given, const std::vector<std::string>& sets) {
  return {study::load(given, overrides_of(sets))};
}

PyExperiment from_json(const std::string& text, const std::vector<std::string>& sets) {
  return {study::from_json(nlohmann::json::parse(text), overrides_of(sets))};
}

// A study's result as Python sees it.
struct PyResult {
  std::shared_ptr<study::Result> result;
  std::string report_json() const {
    return traces::to_json(result->report, result->context).dump();
  }
  std::string summary() const {
    std::ostringstream out;
    traces::print_summary(out, result->report, result->context);
    return out.str();
  }
  std::string memory_summary() const {
    std::ostringstream out;
    traces::print_memory_summary(out, result->report, result->context);
    return out.str();
  }
  bool completed() const { return result->finished(); }
  std::string problem() const { return result->timeline.problem; }
  // Spans as columns: rank, stream (name), op, start and end in seconds, label, microbatch.
  py::dict spans() const {
    const auto& t = result->timeline;
    const auto& program = result->program;
    const auto n = static_cast<py::ssize_t>(t.spans.size());
    py::array_t<std::int32_t> rank(n), op(n), microbatch(n);
    py::array_t<double> start(n), end(n);
    py::list stream, label, phase;
    auto r = rank.mutable_unchecked<1>();
    auto o = op.mutable_unchecked<1>();
    auto m = microbatch.mutable_unchecked<1>();
    auto s = start.mutable_unchecked<1>();
    auto e = end.mutable_unchecked<1>();
    for (py::ssize_t i = 0; i < n; ++i) {
      const auto& span = t.spans[static_cast<std::size_t>(i)];
      const auto& the_op = program.op(span.op);
      r(i) = span.rank;
      o(i) = static_cast<std::int32_t>(span.op);
      m(i) = the_op.microbatch;
      s(i) = span.start.seconds();
      e(i) = span.end.seconds();
      stream.append(std::string(strategies::name_of(span.stream)));
      phase.append(std::string(strategies::name_of(the_op.phase)));
      label.append(program.label_of(the_op));
    }
    py::dict out;
    out["rank"] = rank;
    out["stream"] = stream;
    out["op"] = op;
    out["phase"] = phase;
    out["microbatch"] = microbatch;
    out["label"] = label;
    out["start_s"] = start;
    out["end_s"] = end;
    return out;
  }
  // Memory samples as columns: rank, tier (name), time in seconds, total bytes, op.
  py::dict memory() const {
    const auto& samples = result->timeline.memory;
    const auto n = static_cast<py::ssize_t>(samples.size());
    py::array_t<std::int32_t> rank(n), op(n);
    py::array_t<double> time(n);
    py::array_t<std::int64_t> total(n);
    py::list tier;
    auto r = rank.mutable_unchecked<1>();
    auto o = op.mutable_unchecked<1>();
    auto t = time.mutable_unchecked<1>();
    auto b = total.mutable_unchecked<1>();
    for (py::ssize_t i = 0; i < n; ++i) {
      const auto& sample = samples[static_cast<std::size_t>(i)];
      r(i) = sample.rank;
      o(i) = static_cast<std::int32_t>(sample.op);
      t(i) = sample.time.seconds();
      b(i) = sample.total.count();
      tier.append(std::string(strategies::name_of(sample.tier)));
    }
    py::dict out;
    out["rank"] = rank;
    out["tier"] = tier;
    out["time_s"] = time;
    out["total_bytes"] = total;
    out["op"] = op;
    return out;
  }
  void write(const std::string& dir) const { study::write_outputs(dir, *result); }
  std::size_t op_count() const { return result->program.op_count(); }
};

study::Options options_of(bool exact, const std::string& trace_ranks, const std::string& profile,
                          const std::string& network) {
  study::Options o;
  o.exact = exact;
  o.trace_ranks = trace_ranks;
  // Result.spans() returns the spans of every rank that issues ops, and notebooks plot the first
  // ranks' streams: keep every tensor-parallel rank simulated (data-parallel replicas are still
  // mirrored without `exact`).
  o.mirror_tensor_parallel = false;
  if (!profile.empty()) {
    o.profile = std::make_shared<const hw::DeviceProfile>(hw::load_profile(profile));
  }
  if (!network.empty()) {
    if (network == "analytical") {
      o.network = hw::NetworkModel::analytical;
    } else if (network == "flow") {
      o.network = hw::NetworkModel::flow;
    } else {
      throw study::BadInput("network: expected \"analytical\" or \"flow\", got \"" + network +
                            "\"");
    }
  }
  return o;
}

PyResult simulate(const PyExperiment& e, bool exact, const std::string& trace_ranks,
                  const std::string& profile, const std::string& network, int iterations) {
  py::gil_scoped_release release;
  study::Options options = options_of(exact, trace_ranks, profile, network);
  options.iterations = iterations;
  return {std::make_shared<study::Result>(study::simulate(e.experiment, options))};
}

PyResult memory(const PyExperiment& e, bool exact) {
  py::gil_scoped_release release;
  return {std::make_shared<study::Result>(
      study::estimate_memory(e.experiment, options_of(exact, "auto", "", "")))};
}

int threads(int jobs) {
  return jobs > 0 ? jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Evaluates `combos` in `jobs` threads, in order; the results.
std::vector<search::Result> evaluate(const search::Evaluator& evaluator,
                                     const std::vector<search::Combination>& combos, int jobs) {
  std::vector<search::Result> results(combos.size());
  search::run_ordered(
      0, combos.size(), threads(jobs),
      [&](std::size_t i) {
        results[i] = evaluator.evaluate(combos[i]);
        return std::string();
      },
      [](std::size_t, std::string&&) {}, nullptr);
  return results;
}

// The sweep's CSV text (header and rows, as `stratasim sweep --out` writes it).
std::string sweep(const std::string& experiment, const std::vector<std::string>& sets,
                  const search::GridText& axes, int jobs, bool exact) {
  py::gil_scoped_release release;
  const search::Evaluator evaluator(study::resolve_experiment(experiment), overrides_of(sets),
                                    {.exact = exact});
  search::Grid grid;
  try {
    grid = search::parse_grid(search::for_experiment(axes, evaluator.base()));
  } catch (const std::invalid_argument& e) {
    throw study::BadInput(e.what());
  }
  const auto combos = search::enumerate(grid);
  if (combos.empty()) throw study::BadInput("the grid is empty");
  const auto results = evaluate(evaluator, combos, jobs);
  std::string text = search::csv_header(search::sweep_columns(grid, evaluator));
  for (std::size_t i = 0; i < combos.size(); ++i) text += search::csv_row(combos[i], results[i]);
  return text;
}

// The search's CSV text (as `stratasim search --out` writes it: rank and pareto columns).
std::string search_(const std::string& experiment, const std::vector<std::string>& sets, int gpus,
                    const std::string& objective_name, const std::string& zero,
                    const std::string& recompute, const std::string& micro_batch, int min_gpus,
                    const std::string& schedules, const std::string& interleave,
                    const std::string& sequence_parallel, bool try_fsdp, int jobs, bool exact) {
  py::gil_scoped_release release;
  const auto objective = search::objective_from_name(objective_name);
  if (!objective) {
    throw study::BadInput("objective: expected throughput, memory or cost, got \"" +
                          objective_name + "\"");
  }
  search::SearchSpace space;
  space.gpus = gpus;
  try {
    space.zero = search::parse_zero_stages(zero);
    space.recompute = search::parse_recompute_modes(recompute);
    space.micro_batch = search::parse_positive_list(micro_batch, "--micro-batch");
    // The opt-in axes, read and named as the CLI's flags (empty: the experiment's own).
    if (!schedules.empty()) space.schedules = search::parse_schedules(schedules, "--schedules");
    space.virtual_stages = search::parse_virtual_stages(interleave, "--interleave");
    if (!sequence_parallel.empty()) {
      space.sequence_parallel =
          search::parse_sequence_parallel(sequence_parallel, "--sequence-parallel");
    }
  } catch (const std::invalid_argument& e) {
    throw study::BadInput(e.what());
  }
  if (gpus < 1) throw study::BadInput("--gpus expects a positive number of GPUs");
  if (min_gpus > gpus) {
    throw study::BadInput("--min-gpus " + std::to_string(min_gpus) + ": more than --gpus " +
                          std::to_string(gpus));
  }
  space.fewer_gpus = *objective == search::Objective::cost;
  space.min_gpus = min_gpus;
  space.fsdp = try_fsdp;
  const search::Evaluator evaluator(study::resolve_experiment(experiment), overrides_of(sets),
                                    {.exact = exact, .prune = true});
  std::vector<search::Combination> combos;
  try {
    combos = search::search_space(evaluator.base(), space);
  } catch (const std::invalid_argument& e) {
    throw study::BadInput("gpus " + std::to_string(gpus) + ": " + e.what());
  }
  const auto results = evaluate(evaluator, combos, jobs);
  return search::search_csv(combos, results, search::rank_results(*objective, results));
}

// `stratasim cluster`: (jobs.csv, summary.json, timeline.json) texts.
std::tuple<std::string, std::string, std::string> cluster_run(
    const std::string& trace, const std::string& cluster_name, const std::string& scheduler,
    const std::string& trace_format, std::uint64_t seed, const std::string& restart_cost,
    double tick_s) {
  py::gil_scoped_release release;
  cluster::RunOptions options;
  options.trace = trace;
  options.cluster = cluster_name;
  options.scheduler = scheduler;
  options.trace_format = cluster::parse_trace_format(trace_format, "trace_format");
  options.scheduler_options.seed = seed;
  if (tick_s > 0) options.scheduler_options.tick_s = tick_s;
  try {
    options.restart_cost = parse_time(restart_cost);
  } catch (const std::exception& e) {
    throw study::BadInput("restart_cost: expected a time such as \"30 s\", got \"" + restart_cost +
                          "\"");
  }
  const cluster::ClusterResult result = cluster::run(options);
  std::ostringstream jobs, summary, timeline;
  cluster::write_jobs_csv(jobs, result);
  cluster::write_summary_json(summary, result);
  cluster::write_timeline_json(timeline, result);
  return {jobs.str(), summary.str(), timeline.str()};
}

// `stratasim cluster-trace generate`: the trace's text.
std::string cluster_trace(const std::string& format, const std::string& mix, int jobs, int gpus,
                          double load, double days, std::uint64_t seed) {
  py::gil_scoped_release release;
  cluster::GenerateOptions options;
  options.format = cluster::parse_trace_format(format, "format");
  options.mix = mix;
  options.jobs = jobs;
  options.gpus = gpus;
  options.load = load;
  options.days = days;
  options.seed = seed;
  const cluster::SimulatedThroughput speeds;
  std::ostringstream out;
  cluster::write_generated(out, options, speeds);
  return out.str();
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "stratasim's native part; use the stratasim package";
  static py::exception<study::BadInput> bad_input(m, "BadInput", PyExc_ValueError);
  static py::exception<study::InvalidProgram> failed(m, "SimulationFailed", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const config::ConfigError& e) {
      bad_input(e.what());
    } catch (const traces::TraceError& e) {
      bad_input(e.what());
    } catch (const study::BadInput& e) {
      bad_input(e.what());
    } catch (const nlohmann::json::exception& e) {
      bad_input((std::string("<dict>: ") + e.what()).c_str());
    } catch (const study::InvalidProgram& e) {
      failed(e.what());
    }
  });

  py::class_<PyExperiment>(m, "Experiment")
      .def_property_readonly("name", [](const PyExperiment& e) { return e.experiment.name; })
      .def_property_readonly("description",
                             [](const PyExperiment& e) { return e.experiment.description; })
      .def_property_readonly(
          "world_size", [](const PyExperiment& e) { return e.experiment.cluster.world_size(); })
      .def_property_readonly("tp",
                             [](const PyExperiment& e) { return e.experiment.parallelism.tp; })
      .def_property_readonly("pp",
                             [](const PyExperiment& e) { return e.experiment.parallelism.pp; })
      .def_property_readonly("dp",
                             [](const PyExperiment& e) { return e.experiment.parallelism.dp; })
      .def_property_readonly("notes", [](const PyExperiment& e) { return e.experiment.notes; });
  m.def("load", &load, py::arg("experiment"), py::arg("sets"));
  m.def("from_json", &from_json, py::arg("text"), py::arg("sets"));

  py::class_<PyResult>(m, "Result")
      .def("report_json", &PyResult::report_json)
      .def("summary", &PyResult::summary)
      .def("memory_summary", &PyResult::memory_summary)
      .def("completed", &PyResult::completed)
      .def("problem", &PyResult::problem)
      .def("spans", &PyResult::spans)
      .def("memory", &PyResult::memory)
      .def("write", &PyResult::write, py::arg("dir"))
      .def("op_count", &PyResult::op_count);
  m.def("simulate", &simulate, py::arg("experiment"), py::arg("exact"), py::arg("trace_ranks"),
        py::arg("profile"), py::arg("network"), py::arg("iterations") = 1);
  m.def("memory", &memory, py::arg("experiment"), py::arg("exact"));

  py::class_<search::GridText>(m, "GridText")
      .def(py::init<>())
      .def_readwrite("tp", &search::GridText::tp)
      .def_readwrite("pp", &search::GridText::pp)
      .def_readwrite("dp", &search::GridText::dp)
      .def_readwrite("zero", &search::GridText::zero)
      .def_readwrite("recompute", &search::GridText::recompute)
      .def_readwrite("micro_batch", &search::GridText::micro_batch)
      .def_readwrite("schedule", &search::GridText::schedule)
      .def_readwrite("sequence_parallel", &search::GridText::sequence_parallel)
      .def_readwrite("settings", &search::GridText::settings);
  m.def("sweep", &sweep, py::arg("experiment"), py::arg("sets"), py::arg("grid"), py::arg("jobs"),
        py::arg("exact"));
  m.def("search", &search_, py::arg("experiment"), py::arg("sets"), py::arg("gpus"),
        py::arg("objective"), py::arg("zero"), py::arg("recompute"), py::arg("micro_batch"),
        py::arg("min_gpus"), py::arg("schedules"), py::arg("interleave"),
        py::arg("sequence_parallel"), py::arg("try_fsdp"), py::arg("jobs"), py::arg("exact"));
  m.def("cluster", &cluster_run, py::arg("trace"), py::arg("cluster"), py::arg("scheduler"),
        py::arg("trace_format"), py::arg("seed"), py::arg("restart_cost"), py::arg("tick_s"));
  m.def("cluster_trace", &cluster_trace, py::arg("format"), py::arg("mix"), py::arg("jobs"),
        py::arg("gpus"), py::arg("load"), py::arg("days"), py::arg("seed"));
  m.attr("__version__") = STRATASIM_VERSION;
}
