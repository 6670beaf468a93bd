#include "cluster/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numbers>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cluster/random.hpp"
#include "strategies/experiment.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"

namespace stratasim::cluster {

namespace {

using nlohmann::json;

// ---- times: "YYYY-MM-DD HH:MM:SS" <-> seconds since 1970-01-01 (proleptic Gregorian, UTC) ----

/// Days since 1970-01-01 of a civil date (H. Hinnant's days_from_civil).
long days_from_civil(long y, unsigned m, unsigned d) {
  y -= m <= 2;
  const long era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<long>(doe) - 719468;
}

/// The inverse: (year, month, day) of a day count.
void civil_from_days(long z, long& y, unsigned& m, unsigned& d) {
  z += 719468;
  const long era = (z >= 0 ? z : z - 146096) / 146097;
  const auto doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = static_cast<long>(yoe) + era * 400 + (m <= 2);
}

/// Seconds of "YYYY-MM-DD HH:MM:SS"; false when it does not parse.
bool parse_time(const std::string& text, double& seconds) {
  long y = 0;
  unsigned mo = 0, d = 0, h = 0, mi = 0, s = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%ld-%u-%u %u:%u:%u%c", &y, &mo, &d, &h, &mi, &s, &tail) != 6 ||
      mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) {
    return false;
  }
  seconds = static_cast<double>(days_from_civil(y, mo, d)) * 86400.0 + h * 3600.0 + mi * 60.0 + s;
  return true;
}

std::string format_time(double seconds) {
  const auto whole = static_cast<long>(std::floor(seconds));
  const long days = whole / 86400, rest = whole % 86400;
  long y = 0;
  unsigned m = 0, d = 0;
  civil_from_days(days, y, m, d);
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%04ld-%02u-%02u %02ld:%02ld:%02ld", y, m, d, rest / 3600,
                rest % 3600 / 60, rest % 60);
  return buffer;
}

// The generated traces' time origin: Philly's trace starts in August 2017, Helios' in April 2020.
constexpr double kPhillyOrigin = 1501804800.0;  // 2017-08-04 00:00:00
constexpr double kHeliosOrigin = 1585699200.0;  // 2020-04-01 00:00:00

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw study::BadInput(where + ": " + what);
}

/// Submission times relative to the first; checks the span.
void rebase(Recorded& r) {
  if (r.jobs.empty()) bad(r.source, "no GPU jobs with a recorded run");
  double first = r.jobs.front().submit_s;
  for (const RecordedJob& j : r.jobs) first = std::min(first, j.submit_s);
  for (RecordedJob& j : r.jobs) {
    j.submit_s -= first;
    if (j.submit_s > kMaxTraceSeconds) {
      bad(r.source + ":" + std::to_string(j.line),
          "submitted more than 90 days after the first job (the simulator's clock)");
    }
  }
}

// ---- philly ----

std::string philly_text(const json& o, const char* field, const std::string& where) {
  if (!o.contains(field) || !o.at(field).is_string()) {
    bad(where + "." + field, "expected a string");
  }
  return o.at(field).get<std::string>();
}

/// A time field of an attempt; false when missing or null (the README: a logging error).
bool philly_time(const json& o, const char* field, const std::string& where, double& out) {
  if (!o.contains(field) || o.at(field).is_null()) return false;
  if (!o.at(field).is_string()) bad(where + "." + field, "expected a time string or null");
  const std::string text = o.at(field).get<std::string>();
  if (text.empty() || text == "None") return false;
  if (!parse_time(text, out)) {
    bad(where + "." + field, "expected \"YYYY-MM-DD HH:MM:SS\", got \"" + text + "\"");
  }
  return true;
}

int philly_gpus(const json& attempt, const std::string& where) {
  if (!attempt.contains("detail") || !attempt.at("detail").is_array()) {
    bad(where + ".detail", "expected an array of {ip, gpus}");
  }
  int gpus = 0;
  for (std::size_t d = 0; d < attempt.at("detail").size(); ++d) {
    const json& detail = attempt.at("detail")[d];
    const std::string at = where + ".detail[" + std::to_string(d) + "]";
    if (!detail.is_object() || !detail.contains("gpus") || !detail.at("gpus").is_array()) {
      bad(at + ".gpus", "expected an array of GPU names");
    }
    gpus += static_cast<int>(detail.at("gpus").size());
  }
  return gpus;
}

/// One job of the array; false when it has no usable attempt (skipped).
bool philly_job(const json& o, std::size_t index, const std::string& source, RecordedJob& job) {
  const std::string where = source + ": jobs[" + std::to_string(index) + "]";
  if (!o.is_object()) bad(where, "expected a job object");
  job.id = philly_text(o, "jobid", where);
  job.line = static_cast<int>(index) + 1;
  job.where = where;
  if (!philly_time(o, "submitted_time", where, job.submit_s)) return false;
  if (!o.contains("attempts") || !o.at("attempts").is_array()) {
    bad(where + ".attempts", "expected an array");
  }
  const json& attempts = o.at("attempts");
  if (attempts.empty()) return false;
  double start = 0, end = 0;
  const std::string first = where + ".attempts[0]";
  const std::string last = where + ".attempts[" + std::to_string(attempts.size() - 1) + "]";
  job.gpus = philly_gpus(attempts.front(), first);
  if (!philly_time(attempts.front(), "start_time", first, start) ||
      !philly_time(attempts.back(), "end_time", last, end) || job.gpus == 0) {
    return false;
  }
  job.run_s = end - start;
  if (job.run_s < 0) bad(last + ".end_time", "before the first attempt's start_time");
  return job.run_s > 0;
}

// ---- helios ----

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) {
    if (!cell.empty() && cell.back() == '\r') cell.pop_back();
    cells.push_back(cell);
  }
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

struct HeliosColumns {
  std::map<std::string, std::size_t> index;
  std::size_t count = 0;
  std::size_t at(const std::string& name, const std::string& source) const {
    const auto it = index.find(name);
    if (it == index.end()) bad(source + ":1", "the header lacks the column " + name);
    return it->second;
  }
};

double helios_number(const std::vector<std::string>& cells, std::size_t column,
                     const std::string& where, const std::string& field) {
  double v = 0;
  std::size_t used = 0;
  try {
    v = std::stod(cells[column], &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != cells[column].size() || !std::isfinite(v) || v < 0) {
    bad(where + ": " + field, "expected a number >= 0, got \"" + cells[column] + "\"");
  }
  return v;
}

bool helios_job(const std::string& line, int number, const HeliosColumns& columns,
                const std::string& source, RecordedJob& job) {
  const std::string where = source + ":" + std::to_string(number);
  const std::vector<std::string> cells = split_csv(line);
  if (cells.size() != columns.count) {
    bad(where, "expected " + std::to_string(columns.count) + " cells, got " +
                   std::to_string(cells.size()));
  }
  job.line = number;
  job.where = where;
  job.id = cells[columns.at("job_id", source)];
  if (job.id.empty() || job.id.find('"') != std::string::npos) {
    bad(where + ": job_id", "expected a non-empty id without quotes");
  }
  const double gpus = helios_number(cells, columns.at("gpu_num", source), where, "gpu_num");
  if (gpus != std::floor(gpus) || gpus > 1e6) bad(where + ": gpu_num", "expected an integer");
  job.gpus = static_cast<int>(gpus);
  job.run_s = helios_number(cells, columns.at("duration", source), where, "duration");
  const std::string submit = cells[columns.at("submit_time", source)];
  if (!parse_time(submit, job.submit_s)) {
    bad(where + ": submit_time", "expected \"YYYY-MM-DD HH:MM:SS\", got \"" + submit + "\"");
  }
  return job.gpus > 0 && job.run_s > 0;
}

// ---- the mapping ----

int next_power_of_two(int g) {
  int p = 1;
  while (p < g) p *= 2;
  return p;
}

/// Per experiment: the gradient noise scale (samples) assumed for it (see the header).
double noise_scale_of(const std::string& experiment) {
  static const std::map<std::string, double> phi = {
      {"lstm-2x1024-a100-8", 4096},
      {"lstm-gnmt-8x1024-a100-8", 4096},
      {"gpt3-1.7b-a100-8", 256},
  };
  return phi.at(experiment);
}

Job mapped_job(const RecordedJob& r, const std::string& source, int cluster_gpus,
               const Throughput& speeds) {
  const std::string& where = r.where.empty() ? source : r.where;
  Job job;
  job.id = r.id;
  job.line = r.line;
  job.arrival_s = r.submit_s;
  job.gpus = next_power_of_two(r.gpus);
  if (job.gpus > cluster_gpus) {
    bad(where + ": gpus", "the job asks for " + std::to_string(r.gpus) + " GPUs (" +
                              std::to_string(job.gpus) + " rounded), more than the cluster's " +
                              std::to_string(cluster_gpus));
  }
  const ModelProfile profile = map_job(job.gpus, r.run_s);
  job.experiment = profile.experiment;
  job.experiment_file = study::resolve_experiment(profile.experiment);
  job.batch =
      static_cast<int>(strategies::load_experiment(job.experiment_file).training.global_batch);
  job.min_gpus = std::max(1, job.gpus / 2);
  job.max_gpus = std::min(2 * job.gpus, cluster_gpus);
  job.min_batch = job.batch;
  job.max_batch = 4 * job.batch;
  job.noise_scale = profile.noise_scale;
  const Speed s = speeds.speed(job, job.gpus);
  if (!s.runnable)
    bad(where, job.experiment + " at " + std::to_string(job.gpus) + " GPUs: " + s.why_not);
  job.samples = std::max(1.0, std::floor(r.run_s * s.samples_per_s));
  return job;
}

}  // namespace

TraceFormat parse_trace_format(const std::string& name, const std::string& flag) {
  if (name == "jsonl") return TraceFormat::jsonl;
  if (name == "philly") return TraceFormat::philly;
  if (name == "helios") return TraceFormat::helios;
  throw study::BadInput(flag + ": expected jsonl, philly or helios, got \"" + name + "\"");
}

Recorded read_philly(std::istream& in, const std::string& source) {
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    bad(source, std::string("not JSON (Philly's cluster_job_log is one JSON array): ") + e.what());
  }
  if (!doc.is_array()) bad(source, "expected a JSON array of jobs (Philly's cluster_job_log)");
  Recorded r{source, {}, 0};
  for (std::size_t i = 0; i < doc.size(); ++i) {
    RecordedJob job;
    if (philly_job(doc[i], i, source, job)) {
      r.jobs.push_back(job);
    } else {
      ++r.skipped;
    }
  }
  rebase(r);
  return r;
}

Recorded read_helios(std::istream& in, const std::string& source) {
  std::string line;
  if (!std::getline(in, line)) bad(source, "empty (a header line is expected)");
  HeliosColumns columns;
  const std::vector<std::string> header = split_csv(line);
  for (std::size_t c = 0; c < header.size(); ++c) columns.index[header[c]] = c;
  columns.count = header.size();
  for (const char* name : {"job_id", "gpu_num", "submit_time", "duration"}) {
    (void)columns.at(name, source);
  }
  Recorded r{source, {}, 0};
  for (int number = 2; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    RecordedJob job;
    if (helios_job(line, number, columns, source, job)) {
      r.jobs.push_back(job);
    } else {
      ++r.skipped;
    }
  }
  rebase(r);
  return r;
}

ModelProfile map_job(int gpus, double run_s) {
  std::string experiment;
  if (gpus <= 2) {
    experiment = run_s < 2 * 3600.0 ? "lstm-2x1024-a100-8" : "lstm-gnmt-8x1024-a100-8";
  } else if (gpus <= 8 && run_s < 4 * 3600.0) {
    experiment = "lstm-gnmt-8x1024-a100-8";
  } else {
    experiment = "gpt3-1.7b-a100-8";
  }
  return {experiment, noise_scale_of(experiment)};
}

JobTrace map_recorded(const Recorded& recorded, int cluster_gpus, const Throughput& speeds) {
  JobTrace trace;
  trace.source = recorded.source;
  for (const RecordedJob& r : recorded.jobs) {
    trace.jobs.push_back(mapped_job(r, recorded.source, cluster_gpus, speeds));
  }
  return trace;
}

JobTrace read_workload(const std::filesystem::path& file, TraceFormat format, int cluster_gpus,
                       const Throughput& speeds) {
  if (format == TraceFormat::jsonl) return read_trace(file, cluster_gpus);
  std::ifstream in(file);
  if (!in) throw study::BadInput(file.string() + ": cannot open the trace");
  const Recorded recorded = format == TraceFormat::philly ? read_philly(in, file.string())
                                                          : read_helios(in, file.string());
  return map_recorded(recorded, cluster_gpus, speeds);
}

// ---- the generator ----

namespace {

struct Mix {
  std::vector<std::pair<int, double>> gpus;  // (GPUs, fraction of jobs)
  double median_s = 3600;
  double sigma = 1.6;
};

Mix mix_of(const std::string& name) {
  if (name == "philly") {
    return {{{1, 0.70}, {2, 0.10}, {4, 0.10}, {8, 0.07}, {16, 0.02}, {32, 0.01}}, 3600.0, 1.6};
  }
  if (name == "helios") {
    return {{{1, 0.60}, {2, 0.08}, {4, 0.12}, {8, 0.15}, {16, 0.04}, {32, 0.01}}, 1800.0, 1.8};
  }
  throw study::BadInput("--mix: expected philly or helios, got \"" + name + "\"");
}

/// A standard normal deviate (Box-Muller on two uniforms in (0, 1]).
double normal(Xoshiro256& rng) {
  const double u1 = 1.0 - rng.unit(), u2 = rng.unit();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

int draw_gpus(const Mix& mix, Xoshiro256& rng, int cluster) {
  double u = rng.unit();
  int g = mix.gpus.back().first;
  for (const auto& [gpus, fraction] : mix.gpus) {
    if (u < fraction) {
      g = gpus;
      break;
    }
    u -= fraction;
  }
  return std::min(g, cluster);
}

/// E[g x d] of the mix (lognormal mean: median x exp(sigma^2 / 2); the clamp ignored).
double mean_gpu_seconds(const Mix& mix, int cluster) {
  double mean_g = 0;
  for (const auto& [gpus, fraction] : mix.gpus) mean_g += std::min(gpus, cluster) * fraction;
  return mean_g * mix.median_s * std::exp(mix.sigma * mix.sigma / 2);
}

std::string fmt_number(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.12g", v);
  return buffer;
}

void write_philly(std::ostream& out, const Recorded& r) {
  nlohmann::ordered_json jobs = nlohmann::ordered_json::array();
  for (const RecordedJob& j : r.jobs) {
    nlohmann::ordered_json detail = nlohmann::ordered_json::array();
    for (int left = j.gpus, node = 0; left > 0; left -= 8, ++node) {
      json gpus = json::array();
      for (int g = 0; g < std::min(8, left); ++g) gpus.push_back("gpu" + std::to_string(g));
      nlohmann::ordered_json entry;
      entry["ip"] = "m" + std::to_string(node);
      entry["gpus"] = gpus;
      detail.push_back(entry);
    }
    const double submit = kPhillyOrigin + j.submit_s;
    nlohmann::ordered_json job;
    job["status"] = "Pass";
    job["vc"] = "generated";
    job["jobid"] = j.id;
    nlohmann::ordered_json attempt;
    attempt["start_time"] = format_time(submit);
    attempt["end_time"] = format_time(submit + j.run_s);
    attempt["detail"] = detail;
    job["attempts"] = nlohmann::ordered_json::array({attempt});
    job["submitted_time"] = format_time(submit);
    job["user"] = "generated";
    jobs.push_back(job);
  }
  out << jobs.dump(1) << '\n';
}

void write_helios(std::ostream& out, const Recorded& r) {
  out << "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,"
         "queue\n";
  for (const RecordedJob& j : r.jobs) {
    const double submit = kHeliosOrigin + j.submit_s;
    out << j.id << ",ugen,vcgen," << j.gpus << ',' << 4 * j.gpus << ',' << (j.gpus + 7) / 8
        << ",COMPLETED," << format_time(submit) << ',' << format_time(submit) << ','
        << format_time(submit + j.run_s) << ',' << fmt_number(j.run_s) << ",0\n";
  }
}

void write_jsonl(std::ostream& out, const GenerateOptions& o, const Recorded& r,
                 const Throughput& speeds) {
  out << "# Generated by `stratasim cluster-trace generate --format jsonl --mix " << o.mix
      << " --jobs " << o.jobs << " --gpus " << o.gpus
      << (o.days > 0 ? " --days " + fmt_number(o.days) : " --load " + fmt_number(o.load))
      << " --seed " << o.seed << "`\n# (cluster/workload.hpp: distributions and the mapping to "
      << "configs/experiments).\n";
  const JobTrace trace = map_recorded(r, o.gpus, speeds);
  for (const Job& j : trace.jobs) {
    nlohmann::ordered_json line;
    line["id"] = j.id;
    line["arrival_s"] = j.arrival_s;
    line["experiment"] = j.experiment;
    line["samples"] = j.samples;
    line["gpus"] = j.gpus;
    line["min_gpus"] = j.min_gpus;
    line["max_gpus"] = j.max_gpus;
    line["min_batch"] = j.min_batch;
    line["max_batch"] = j.max_batch;
    line["noise_scale"] = j.noise_scale;
    out << line.dump() << '\n';
  }
}

}  // namespace

Recorded generate_recorded(const GenerateOptions& o) {
  if (o.jobs < 1) throw study::BadInput("--jobs: expected an integer >= 1");
  if (o.gpus < 1) throw study::BadInput("--gpus: expected an integer >= 1");
  if (!(o.load > 0)) throw study::BadInput("--load: expected a number > 0");
  const Mix mix = mix_of(o.mix);
  if (o.days < 0) throw study::BadInput("--days: expected a number >= 0");
  const double rate = o.days > 0 ? o.jobs / (o.days * 86400.0)
                                 : o.load * o.gpus / mean_gpu_seconds(mix, o.gpus);  // jobs/s
  Xoshiro256 rng(o.seed);
  Recorded r{"generated", {}, 0};
  double t = 0;
  for (int i = 0; i < o.jobs; ++i) {
    if (i > 0) t += -std::log(1.0 - rng.unit()) / rate;
    RecordedJob j;
    j.id = "j" + std::to_string(i);
    j.submit_s = std::floor(t);
    j.gpus = draw_gpus(mix, rng, o.gpus);
    const double run = mix.median_s * std::exp(mix.sigma * normal(rng));
    j.run_s = std::floor(std::clamp(run, 60.0, 7 * 86400.0));
    j.line = i + 1;
    r.jobs.push_back(j);
  }
  if (r.jobs.back().submit_s > kMaxTraceSeconds) {
    throw study::BadInput("--jobs: the arrivals span more than 90 days (fewer jobs, or more load)");
  }
  return r;
}

void write_generated(std::ostream& out, const GenerateOptions& o, const Throughput& speeds) {
  const Recorded r = generate_recorded(o);
  switch (o.format) {
    case TraceFormat::philly:
      write_philly(out, r);
      return;
    case TraceFormat::helios:
      write_helios(out, r);
      return;
    case TraceFormat::jsonl:
      write_jsonl(out, o, r, speeds);
      return;
  }
}

}  // namespace stratasim::cluster
