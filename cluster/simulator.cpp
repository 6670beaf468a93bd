#include "cluster/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <queue>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "hw_models/cluster.hpp"
#include "hw_models/files.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"

namespace stratasim::cluster {

namespace {

enum class EventKind { arrival, completion, restart_end, tick };

struct Event {
  Time time;
  std::uint64_t sequence = 0;
  EventKind kind = EventKind::tick;
  int job = -1;
  int version = 0;
  bool operator>(const Event& o) const {
    return time != o.time ? time > o.time : sequence > o.sequence;
  }
};

struct JobState {
  bool arrived = false, done = false, started = false, needs_restart = false;
  int gpus = 0;
  int batch = 0;     // global batch while it holds GPUs
  double speed = 0;  // base-batch samples/s at (gpus, batch): throughput x efficiency
  double last_change_s = -1;
  double remaining = 0;  // samples, as of progress_since
  Time progress_since;   // progress counts from here (after a restart)
  Time held_since;       // attained service counts from here
  double attained_gpu_s = 0, attained_s = 0;
  int version = 0;  // invalidates scheduled completions and restart ends
  Time segment_start;
  bool segment_restarting = false;
};

/// The event loop's state and steps; simulate_cluster() drives it.
class Run {
 public:
  Run(const JobTrace& trace, Scheduler& scheduler, const Throughput& speeds,
      const SimulationOptions& options)
      : trace_(trace),
        scheduler_(scheduler),
        speeds_(speeds),
        options_(options),
        state_(trace.jobs.size()) {
    order_.resize(trace.jobs.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) {
      const Job &x = trace.jobs[static_cast<std::size_t>(a)],
                &y = trace.jobs[static_cast<std::size_t>(b)];
      return x.arrival_s != y.arrival_s ? x.arrival_s < y.arrival_s : x.id < y.id;
    });
    result_.scheduler = scheduler.name();
    result_.total_gpus = options.total_gpus;
    result_.restart_cost_s = options.restart_cost.seconds();
    for (std::size_t i = 0; i < trace.jobs.size(); ++i) state_[i].remaining = trace.jobs[i].samples;
    for (const Job& j : trace.jobs) {
      JobResult r;
      r.id = j.id;
      r.gpus = j.gpus;
      r.samples = j.samples;
      r.arrival_s = j.arrival_s;
      result_.jobs.push_back(r);
    }
  }

  ClusterResult go();

 private:
  void check_runnable();

  void push(Time t, EventKind kind, int job = -1, int version = 0) {
    events_.push({t, sequence_++, kind, job, version});
  }

  JobState& at(int i) { return state_[static_cast<std::size_t>(i)]; }

  /// Applies one event; true when it calls for a scheduling decision.
  bool handle(const Event& e, Time now);

  /// Brings attained service and progress of job i up to `now`.
  void settle(int i, Time now);

  void close_segment(int i, Time now);

  void complete(int i, Time now);

  std::vector<int> active() const;

  void decision(Time now);

  /// A policy that leaves every active job queued on an idle cluster with no arrival to come
  /// would tick forever: a policy bug.
  void check_progress(const std::vector<int>& jobs) const;

  void check_allocation(const SchedulerInput& input, const std::vector<Allocation>& wanted) const;

  void apply(int i, const Allocation& a, Time now);

  void start(int i, int n, int batch, Time now);

  void record_utilisation(Time now);

  void summarise();

  const JobTrace& trace_;
  Scheduler& scheduler_;
  const Throughput& speeds_;
  SimulationOptions options_;
  std::vector<JobState> state_;
  std::vector<int> order_;  // job indices by (arrival, id)
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::uint64_t sequence_ = 0;
  bool tick_pending_ = false;
  ClusterResult result_;
};

ClusterResult Run::go() {
  check_runnable();
  for (int i : order_) {
    push(Time::from_seconds(trace_.jobs[static_cast<std::size_t>(i)].arrival_s), EventKind::arrival,
         i);
  }
  while (!events_.empty()) {
    const Time now = events_.top().time;
    bool decide = false;
    while (!events_.empty() && events_.top().time == now) {
      const Event e = events_.top();
      events_.pop();
      decide = handle(e, now) || decide;
    }
    if (decide) decision(now);
  }
  for (std::size_t i = 0; i < state_.size(); ++i) {
    if (!state_[i].done) {
      throw std::logic_error("cluster: job " + trace_.jobs[i].id + " never finished under " +
                             scheduler_.name() + " (the policy left it queued on a idle cluster)");
    }
  }
  summarise();
  return std::move(result_);
}

void Run::check_runnable() {
  for (std::size_t i = 0; i < trace_.jobs.size(); ++i) {
    const Job& j = trace_.jobs[i];
    const Speed s = speeds_.speed(j, j.gpus);
    result_.jobs[i].samples_per_s = s.samples_per_s;
    if (!s.runnable) {
      throw study::BadInput(trace_.source + ":" + std::to_string(j.line) + ": job " + j.id + " (" +
                            j.experiment + ") at its " + std::to_string(j.gpus) +
                            " GPUs: " + s.why_not);
    }
  }
}

bool Run::handle(const Event& e, Time now) {
  switch (e.kind) {
    case EventKind::arrival:
      at(e.job).arrived = true;
      return true;
    case EventKind::tick:
      tick_pending_ = false;
      return true;
    case EventKind::restart_end:
      if (e.version != at(e.job).version) return false;
      close_segment(e.job, now);
      at(e.job).segment_restarting = false;
      return false;
    case EventKind::completion:
      if (e.version != at(e.job).version) return false;
      complete(e.job, now);
      return true;
  }
  return false;
}

void Run::settle(int i, Time now) {
  JobState& s = at(i);
  if (s.gpus == 0) return;
  const double held = (now - s.held_since).seconds();
  s.attained_gpu_s += s.gpus * held;
  s.attained_s += held;
  s.held_since = now;
  if (now > s.progress_since) {
    s.remaining = std::max(0.0, s.remaining - s.speed * (now - s.progress_since).seconds());
    s.progress_since = now;
  }
}

void Run::close_segment(int i, Time now) {
  const JobState& s = at(i);
  if (now > s.segment_start) {
    result_.segments.push_back(
        {i, s.gpus, s.segment_start.seconds(), now.seconds(), s.segment_restarting, s.batch});
  }
  at(i).segment_start = now;
}

void Run::complete(int i, Time now) {
  settle(i, now);
  close_segment(i, now);
  JobState& s = at(i);
  s.remaining = 0;
  s.done = true;
  s.gpus = 0;
  JobResult& r = result_.jobs[static_cast<std::size_t>(i)];
  r.completion_s = now.seconds();
  r.jct_s = r.completion_s - r.arrival_s;
  r.gpu_seconds = s.attained_gpu_s;
}

std::vector<int> Run::active() const {
  std::vector<int> out;
  for (int i : order_) {
    const JobState& s = state_[static_cast<std::size_t>(i)];
    if (s.arrived && !s.done) out.push_back(i);
  }
  return out;
}

void Run::decision(Time now) {
  const std::vector<int> jobs = active();
  SchedulerInput input{
      now.seconds(), options_.total_gpus, {}, &speeds_, options_.restart_cost.seconds()};
  for (int i : jobs) {
    settle(i, now);
    const JobState& s = at(i);
    const Job& j = trace_.jobs[static_cast<std::size_t>(i)];
    input.jobs.push_back({&j, s.gpus, s.attained_gpu_s, s.attained_s, s.remaining,
                          s.gpus > 0 ? s.batch : j.batch, s.last_change_s});
  }
  std::vector<Allocation> wanted = scheduler_.decide(input);
  for (std::size_t k = 0; k < wanted.size() && k < input.jobs.size(); ++k) {
    if (wanted[k].batch == 0) wanted[k].batch = input.jobs[k].job->batch;
  }
  check_allocation(input, wanted);
  for (std::size_t k = 0; k < jobs.size(); ++k) apply(jobs[k], wanted[k], now);
  record_utilisation(now);
  check_progress(jobs);
  if (const auto tick = scheduler_.tick_s(); tick && !jobs.empty() && !tick_pending_) {
    tick_pending_ = true;
    push(now + Time::from_seconds(*tick), EventKind::tick);
  }
}

void Run::check_progress(const std::vector<int>& jobs) const {
  if (jobs.empty()) return;
  for (const JobState& s : state_) {
    if (s.gpus > 0 || !s.arrived) return;
  }
  throw std::logic_error("cluster: scheduler " + scheduler_.name() + " left " +
                         std::to_string(jobs.size()) + " jobs queued on an idle cluster");
}

void Run::check_allocation(const SchedulerInput& input,
                           const std::vector<Allocation>& wanted) const {
  const std::string who = "cluster: scheduler " + scheduler_.name() + " ";
  if (wanted.size() != input.jobs.size()) {
    throw std::logic_error(who + "returned " + std::to_string(wanted.size()) + " allocations for " +
                           std::to_string(input.jobs.size()) + " jobs");
  }
  long total = 0;
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    const Job& j = *input.jobs[k].job;
    const int n = wanted[k].gpus, batch = wanted[k].batch;
    if (batch != j.batch && (batch < j.min_batch || batch > j.max_batch)) {
      throw std::logic_error(who + "gave job " + j.id + " batch " + std::to_string(batch) +
                             " (outside [" + std::to_string(j.min_batch) + ", " +
                             std::to_string(j.max_batch) + "])");
    }
    if (n != 0 && (n < j.min_gpus || n > j.max_gpus || !speeds_.speed(j, n, batch).runnable)) {
      throw std::logic_error(who + "gave job " + j.id + " " + std::to_string(n) +
                             " GPUs (outside its range or not runnable)");
    }
    total += n;
  }
  if (total > input.total_gpus) {
    throw std::logic_error(who + "allocated " + std::to_string(total) + " GPUs of " +
                           std::to_string(input.total_gpus));
  }
}

void Run::apply(int i, const Allocation& a, Time now) {
  JobState& s = at(i);
  const int n = a.gpus;
  if (n == s.gpus && (n == 0 || a.batch == s.batch)) return;
  if (s.gpus > 0) {  // preempted or resized: progress is kept, a restart is owed
    close_segment(i, now);
    if (n == 0) ++result_.jobs[static_cast<std::size_t>(i)].preemptions;
    s.needs_restart = true;
    s.gpus = 0;
    s.last_change_s = now.seconds();
    ++s.version;
  }
  if (n > 0) start(i, n, a.batch, now);
}

void Run::start(int i, int n, int batch, Time now) {
  JobState& s = at(i);
  JobResult& r = result_.jobs[static_cast<std::size_t>(i)];
  if (!s.started) {
    s.started = true;
    r.start_s = now.seconds();
    r.queueing_s = r.start_s - r.arrival_s;
  }
  s.gpus = n;
  s.batch = batch;
  const Job& job = trace_.jobs[static_cast<std::size_t>(i)];
  s.speed = speeds_.speed(job, n, batch).samples_per_s * job.efficiency(batch);
  s.held_since = now;
  s.segment_start = now;
  s.progress_since = now;
  ++s.version;
  s.segment_restarting = s.needs_restart && options_.restart_cost > Time();
  if (s.needs_restart) {
    ++r.restarts;
    s.needs_restart = false;
    s.progress_since = now + options_.restart_cost;
    if (s.segment_restarting) push(s.progress_since, EventKind::restart_end, i, s.version);
  }
  const double ps = std::ceil(s.remaining / s.speed * 1e12);
  if (s.progress_since.seconds() + ps * 1e-12 > kMaxTraceSeconds) {
    const Job& j = trace_.jobs[static_cast<std::size_t>(i)];
    throw study::BadInput(trace_.source + ":" + std::to_string(j.line) + ": job " + j.id +
                          " would finish after " +
                          std::to_string(static_cast<long>(kMaxTraceSeconds)) +
                          " s, past the simulator's clock (fewer samples, or more GPUs)");
  }
  push(s.progress_since + Time::ps(static_cast<std::int64_t>(ps)), EventKind::completion, i,
       s.version);
}

void Run::record_utilisation(Time now) {
  int busy = 0;
  for (const JobState& s : state_) busy += s.gpus;
  auto& steps = result_.utilisation;
  if (!steps.empty() && steps.back().time_s == now.seconds()) steps.pop_back();
  if (steps.empty() || steps.back().busy_gpus != busy) steps.push_back({now.seconds(), busy});
}

void Run::summarise() {
  ClusterSummary& m = result_.summary;
  std::vector<double> jct;
  double first_arrival = 1e300, last_completion = 0, gpu_seconds = 0, queueing = 0;
  for (const JobResult& r : result_.jobs) {
    jct.push_back(r.jct_s);
    first_arrival = std::min(first_arrival, r.arrival_s);
    last_completion = std::max(last_completion, r.completion_s);
    gpu_seconds += r.gpu_seconds;
    queueing += r.queueing_s;
    m.preemptions += r.preemptions;
  }
  m.jobs = static_cast<int>(jct.size());
  m.mean_jct_s = std::accumulate(jct.begin(), jct.end(), 0.0) / m.jobs;
  m.p50_jct_s = percentile(jct, 50);
  m.p90_jct_s = percentile(jct, 90);
  m.p99_jct_s = percentile(jct, 99);
  m.mean_queueing_s = queueing / m.jobs;
  m.makespan_s = last_completion - first_arrival;
  m.mean_utilisation = m.makespan_s > 0 ? gpu_seconds / (result_.total_gpus * m.makespan_s) : 0.0;
}

std::string fmt(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.12g", v);
  return buffer;
}

}  // namespace

ClusterResult simulate_cluster(const JobTrace& trace, Scheduler& scheduler,
                               const Throughput& speeds, const SimulationOptions& options) {
  if (options.total_gpus < 1) throw study::BadInput("cluster: the cluster has no GPUs");
  return Run(trace, scheduler, speeds, options).go();
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const auto index = static_cast<std::size_t>(std::max(1.0, rank)) - 1;
  return values[std::min(index, values.size() - 1)];
}

void write_jobs_csv(std::ostream& out, const ClusterResult& result) {
  out << "id,gpus,samples,samples_per_s,arrival_s,start_s,completion_s,jct_s,queueing_s,"
         "preemptions,restarts,"
         "gpu_seconds\n";
  for (const JobResult& r : result.jobs) {
    out << r.id << ',' << r.gpus << ',' << fmt(r.samples) << ',' << fmt(r.samples_per_s) << ','
        << fmt(r.arrival_s) << ',' << fmt(r.start_s) << ',' << fmt(r.completion_s) << ','
        << fmt(r.jct_s) << ',' << fmt(r.queueing_s) << ',' << r.preemptions << ',' << r.restarts
        << ',' << fmt(r.gpu_seconds) << '\n';
  }
}

void write_summary_json(std::ostream& out, const ClusterResult& result) {
  const ClusterSummary& m = result.summary;
  nlohmann::ordered_json j;
  j["scheduler"] = result.scheduler;
  j["gpus"] = result.total_gpus;
  j["restart_cost_s"] = result.restart_cost_s;
  j["jobs"] = m.jobs;
  j["mean_jct_s"] = m.mean_jct_s;
  j["p50_jct_s"] = m.p50_jct_s;
  j["p90_jct_s"] = m.p90_jct_s;
  j["p99_jct_s"] = m.p99_jct_s;
  j["mean_queueing_s"] = m.mean_queueing_s;
  j["makespan_s"] = m.makespan_s;
  j["mean_utilisation"] = m.mean_utilisation;
  j["preemptions"] = m.preemptions;
  j["utilisation"] = nlohmann::ordered_json::array();
  for (const UtilisationStep& s : result.utilisation) {
    j["utilisation"].push_back({s.time_s, s.busy_gpus});
  }
  out << j.dump(2) << '\n';
}

void write_timeline_json(std::ostream& out, const ClusterResult& result) {
  using nlohmann::ordered_json;
  ordered_json events = ordered_json::array();
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", "jobs"}}}});
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", "cluster"}}}});
  for (std::size_t i = 0; i < result.jobs.size(); ++i) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 0},
                      {"tid", i},
                      {"args", {{"name", result.jobs[i].id}}}});
  }
  for (const Segment& s : result.segments) {
    const JobResult& r = result.jobs[static_cast<std::size_t>(s.job)];
    events.push_back({{"ph", "X"},
                      {"name", s.restarting ? "restart" : r.id},
                      {"pid", 0},
                      {"tid", s.job},
                      {"ts", s.start_s * 1e6},
                      {"dur", (s.end_s - s.start_s) * 1e6},
                      {"args", {{"gpus", s.gpus}, {"batch", s.batch}}}});
  }
  for (const UtilisationStep& u : result.utilisation) {
    events.push_back({{"ph", "C"},
                      {"name", "busy GPUs"},
                      {"pid", 1},
                      {"ts", u.time_s * 1e6},
                      {"args", {{"busy", u.busy_gpus}}}});
  }
  ordered_json doc;
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  out << doc.dump() << '\n';
}

void write_outputs(const std::filesystem::path& dir, const ClusterResult& result) {
  std::filesystem::create_directories(dir);
  files::StagedWrites writes;
  writes.stage(dir / "jobs.csv", [&](std::ostream& o) { write_jobs_csv(o, result); });
  writes.stage(dir / "summary.json", [&](std::ostream& o) { write_summary_json(o, result); });
  writes.stage(dir / "timeline.json", [&](std::ostream& o) { write_timeline_json(o, result); });
  writes.commit();
}

ClusterResult run(const RunOptions& options) {
  const hw::ClusterSpec spec = hw::load_cluster(study::resolve_cluster(options.cluster));
  const int gpus = spec.world_size();
  const std::unique_ptr<Scheduler> scheduler =
      make_scheduler(options.scheduler, options.scheduler_options);
  const SimulatedThroughput speeds;
  const JobTrace trace = read_workload(options.trace, options.trace_format, gpus, speeds);
  SimulationOptions sim;
  sim.total_gpus = gpus;
  sim.restart_cost = options.restart_cost;
  return simulate_cluster(trace, *scheduler, speeds, sim);
}

}  // namespace stratasim::cluster
