#include "study/jobs.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "study/errors.hpp"

namespace stratasim::study {

namespace {

using strategies::OpId;
using strategies::Program;

/// "0-7,16" -> {0..7, 16}.
std::vector<std::int32_t> parse_ranges(std::string_view text, int world, std::size_t job) {
  try {
    const auto devices = hw::parse_device_ranges(text, world);
    return {devices.begin(), devices.end()};
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("--placement: job " + std::to_string(job + 1) + ": " + e.what());
  }
}

/// Device -> the job placed on it (-1: none).
std::vector<int> job_of_device(std::span<const Placement> placements, int world) {
  std::vector<int> job(static_cast<std::size_t>(world), -1);
  for (std::size_t j = 0; j < placements.size(); ++j) {
    for (std::int32_t d : placements[j].devices)
      job[static_cast<std::size_t>(d)] = static_cast<int>(j);
  }
  return job;
}

/// "job 2 (b)": jobs by their number from 1, as the command line and its output count them.
std::string job_title(std::span<const std::string> names, std::size_t j) {
  return "job " + std::to_string(j + 1) + " (" + names[j] + ")";
}

/// The value of transport.`key` in `t`, as the section writes it.
std::string transport_value(const strategies::TransportPolicy& t, const std::string& key) {
  if (key == "priority") return "\"" + std::string(name_of(t.priority)) + "\"";
  if (key == "scheduling") return "\"" + std::string(name_of(t.scheduling)) + "\"";
  if (key == "within_class") return "\"" + std::string(name_of(t.within_class)) + "\"";
  std::string list;
  for (double w : t.weights) {
    std::ostringstream text;
    text << w;
    list += (list.empty() ? "" : ", ") + text.str();
  }
  return "[" + list + "]";
}

/// Each job's LossObserver, fed the transfers its ranks describe.
class JobLosses : public sim::Observer {
 public:
  JobLosses(std::span<const Placement> placements, int world)
      : losses(placements.size()), job_(job_of_device(placements, world)) {}
  void on_transfer(const strategies::Op& op, const sim::TransferRequest& request) override {
    const int j = job_[static_cast<std::size_t>(op.rank)];
    if (j >= 0) losses[static_cast<std::size_t>(j)].on_transfer(op, request);
  }
  std::vector<LossObserver> losses;  // per job

 private:
  std::vector<int> job_;
};

}  // namespace

std::vector<Placement> place_jobs(std::span<const int> sizes, std::string_view spec,
                                  const hw::ClusterSpec& cluster) {
  const int world = cluster.world_size();
  std::vector<Placement> out(sizes.size());
  long long total = 0;
  for (int n : sizes) total += n;
  if (spec == "packed" || spec == "interleaved") {
    if (total > world) {
      throw std::invalid_argument("--placement: the jobs need " + std::to_string(total) +
                                  " devices, but cluster " + cluster.name + " has " +
                                  std::to_string(world));
    }
  }
  if (spec == "packed") {
    std::int32_t next = 0;
    for (std::size_t j = 0; j < sizes.size(); ++j) {
      for (int r = 0; r < sizes[j]; ++r) out[j].devices.push_back(next++);
    }
  } else if (spec == "interleaved") {
    // Deal whole nodes round-robin; a job takes devices of its node in order.
    std::size_t job = 0;
    for (int node = 0; node < cluster.nodes; ++node) {
      std::size_t tried = 0;
      while (tried < sizes.size() && static_cast<int>(out[job].devices.size()) >= sizes[job]) {
        job = (job + 1) % sizes.size();
        ++tried;
      }
      if (tried == sizes.size()) break;
      for (int d = 0; d < cluster.devices_per_node; ++d) {
        if (static_cast<int>(out[job].devices.size()) >= sizes[job]) break;
        out[job].devices.push_back(node * cluster.devices_per_node + d);
      }
      job = (job + 1) % sizes.size();
    }
  } else {
    std::size_t at = 0;
    std::size_t j = 0;
    while (at <= spec.size()) {
      const std::size_t semi = std::min(spec.find(';', at), spec.size());
      if (j >= sizes.size()) {
        throw std::invalid_argument("--placement: " + std::to_string(j + 1) + " device lists for " +
                                    std::to_string(sizes.size()) +
                                    " jobs; expected packed, interleaved or one list per job "
                                    "separated by ';'");
      }
      out[j].devices = parse_ranges(spec.substr(at, semi - at), world, j);
      at = semi + 1;
      ++j;
    }
    if (j != sizes.size()) {
      throw std::invalid_argument("--placement: " + std::to_string(j) + " device lists for " +
                                  std::to_string(sizes.size()) +
                                  " jobs; expected one list per job separated by ';'");
    }
  }
  std::vector<int> owner(static_cast<std::size_t>(world), -1);
  for (std::size_t j = 0; j < sizes.size(); ++j) {
    if (static_cast<int>(out[j].devices.size()) != sizes[j]) {
      throw std::invalid_argument("--placement: job " + std::to_string(j + 1) + " needs " +
                                  std::to_string(sizes[j]) + " devices, got " +
                                  std::to_string(out[j].devices.size()));
    }
    for (std::int32_t d : out[j].devices) {
      int& o = owner[static_cast<std::size_t>(d)];
      if (o >= 0) {
        throw std::invalid_argument("--placement: device " + std::to_string(d) +
                                    " is given to job " + std::to_string(o + 1) + " and job " +
                                    std::to_string(j + 1));
      }
      o = static_cast<int>(j);
    }
  }
  return out;
}

Program merge_programs(std::span<const Program* const> programs,
                       std::span<const Placement> placements, std::span<const std::string> names,
                       int world) {
  if (programs.size() != placements.size() || programs.size() != names.size()) {
    throw std::invalid_argument("merge_programs: one placement and name per program");
  }
  struct Slot {
    int job = -1;
    int rank = 0;
  };
  std::vector<Slot> slot(static_cast<std::size_t>(world));
  for (std::size_t j = 0; j < programs.size(); ++j) {
    if (programs[j]->mirrored()) {
      throw std::invalid_argument("merge_programs: job " + names[j] +
                                  " is mirrored; lower it with every replica");
    }
    const auto& devices = placements[j].devices;
    if (static_cast<int>(devices.size()) != programs[j]->world_size()) {
      throw std::invalid_argument("merge_programs: job " + names[j] + " has " +
                                  std::to_string(programs[j]->world_size()) + " ranks but " +
                                  std::to_string(devices.size()) + " devices");
    }
    for (std::size_t r = 0; r < devices.size(); ++r) {
      slot[static_cast<std::size_t>(devices[r])] = {static_cast<int>(j), static_cast<int>(r)};
    }
  }
  Program merged(world);
  std::size_t ops = 0, deps = 0, effects = 0;
  for (const auto* p : programs) {
    ops += p->op_count();
    for (const auto& o : p->ops()) {
      deps += o.deps_count;
      effects += o.effects_count;
    }
  }
  merged.reserve(ops, deps, effects);
  std::vector<std::uint32_t> group_base(programs.size()), list_base(programs.size());
  for (std::size_t j = 0; j < programs.size(); ++j) {
    const auto& devices = placements[j].devices;
    group_base[j] = static_cast<std::uint32_t>(merged.groups().size());
    for (const auto& g : programs[j]->groups()) {
      std::vector<std::int32_t> ranks;
      ranks.reserve(g.ranks.size());
      for (std::int32_t r : g.ranks) ranks.push_back(devices[static_cast<std::size_t>(r)]);
      merged.add_group(std::move(ranks), names[j] + ": " + g.name);
    }
    list_base[j] = static_cast<std::uint32_t>(merged.kernel_lists().size());
    for (const auto& list : programs[j]->kernel_lists()) merged.add_kernels(list);
  }
  std::vector<OpId> dep_buffer;
  std::vector<strategies::MemoryEffect> effect_buffer;
  for (int d = 0; d < world; ++d) {
    merged.begin_rank(d);
    const Slot s = slot[static_cast<std::size_t>(d)];
    if (s.job < 0) continue;
    const Program& p = *programs[static_cast<std::size_t>(s.job)];
    const auto& devices = placements[static_cast<std::size_t>(s.job)].devices;
    for (const auto& m : p.initial_memory(s.rank)) merged.add_initial_memory(d, m);
    if (p.event_driven(s.rank)) merged.set_event_driven(d);  // a parameter server
    const OpId old_first = p.first_op(s.rank);
    const OpId new_first = static_cast<OpId>(merged.op_count());
    for (const auto& o : p.ops_of(s.rank)) {
      strategies::Work work = o.work;
      if (auto* c = std::get_if<strategies::Collective>(&work)) {
        c->group += group_base[static_cast<std::size_t>(s.job)];
      } else if (auto* compute = std::get_if<strategies::Compute>(&work)) {
        compute->kernels += list_base[static_cast<std::size_t>(s.job)];
      } else if (auto* send = std::get_if<strategies::Send>(&work)) {
        send->peer = devices[static_cast<std::size_t>(send->peer)];
      } else if (auto* recv = std::get_if<strategies::Recv>(&work)) {
        recv->peer = devices[static_cast<std::size_t>(recv->peer)];
      }
      dep_buffer.clear();
      for (OpId dep : p.deps_of(o)) dep_buffer.push_back(new_first + (dep - old_first));
      const auto fx = p.effects_of(o);
      effect_buffer.assign(fx.begin(), fx.end());
      // The op's provenance; its label by text, as the merged Program interns labels anew.
      strategies::OpInfo info = strategies::info_of(o);
      info.label_id = strategies::OpInfo::kNoLabel;
      info.label = p.label_of(o);
      merged.add(std::move(work), info, dep_buffer, effect_buffer);
    }
  }
  merged.finish();
  return merged;
}

traces::Timeline split_timeline(const traces::Timeline& merged, const Program& merged_program,
                                const Program& job, const Placement& placement) {
  traces::Timeline out;
  out.world_size = job.world_size();
  out.completed = merged.completed;
  out.problem = merged.problem;
  out.stopped_on_oom = merged.stopped_on_oom;
  out.events = merged.events;
  // Device -> job rank.
  std::vector<std::int32_t> rank_of(static_cast<std::size_t>(merged_program.world_size()), -1);
  for (std::size_t r = 0; r < placement.devices.size(); ++r) {
    rank_of[static_cast<std::size_t>(placement.devices[r])] = static_cast<std::int32_t>(r);
  }
  auto job_op = [&](std::int32_t device, OpId id) {
    const std::int32_t r = rank_of[static_cast<std::size_t>(device)];
    return job.first_op(r) + (id - merged_program.first_op(device));
  };
  const bool indexed = merged.spans.size() == merged_program.op_count();
  if (indexed) out.spans.resize(job.op_count());
  for (const auto& span : merged.spans) {
    const std::int32_t r = rank_of[static_cast<std::size_t>(span.rank)];
    if (r < 0) continue;
    traces::Span s = span;
    s.rank = r;
    s.op = job_op(span.rank, span.op);
    if (indexed) {
      out.spans[s.op] = s;
    } else {
      out.spans.push_back(s);
    }
  }
  for (const auto& sample : merged.memory) {
    const std::int32_t r = rank_of[static_cast<std::size_t>(sample.rank)];
    if (r < 0) continue;
    traces::MemorySample m = sample;
    m.rank = r;
    m.op = job_op(sample.rank, sample.op);
    out.memory.push_back(m);
  }
  out.ranks.resize(placement.devices.size());
  for (std::size_t r = 0; r < placement.devices.size(); ++r) {
    const auto device = placement.devices[r];
    if (static_cast<std::size_t>(device) >= merged.ranks.size()) continue;
    out.ranks[r] = merged.ranks[static_cast<std::size_t>(device)];
    for (auto& tier : out.ranks[r].tiers) {
      if (job.op_count() > 0 && merged_program.ops_of(device).size() > 0) {
        tier.op = job_op(device, tier.op);
      }
    }
  }
  for (const auto& oom : merged.out_of_memory) {
    const std::int32_t r = rank_of[static_cast<std::size_t>(oom.rank)];
    if (r < 0) continue;
    traces::OutOfMemory o = oom;
    o.rank = r;
    o.first_op = job_op(oom.rank, oom.first_op);
    out.out_of_memory.push_back(o);
  }
  return out;
}

void set_job_transports(sim::SimOptions& options,
                        std::span<const strategies::TransportPolicy> transports,
                        std::span<const Placement> placements, std::span<const std::string> names,
                        int world) {
  if (transports.size() != placements.size() || transports.size() != names.size()) {
    throw std::invalid_argument("set_job_transports: one placement and name per policy");
  }
  if (transports.size() > 0xFFFF) {
    throw BadInput("simulate_jobs: at most 65535 jobs take transport policies, got " +
                   std::to_string(transports.size()));
  }
  if (const auto conflict = sim::transport_conflict(transports)) {
    const auto& key = conflict->key;
    const std::string why =
        key == "priority"
            ? "\"fifo\" orders every job's messages by start, the others by class: the jobs "
              "that set classes must all use \"fifo\" or none of them"
            : "the jobs share the fabric's links, which serve classes one way: the jobs that set "
              "classes must set the same transport.scheduling, transport.within_class and "
              "transport.weights";
    throw BadInput(job_title(names, conflict->second) + ": transport." + key + " " +
                   transport_value(transports[conflict->second], key) + " differs from " +
                   job_title(names, conflict->first) + "'s " +
                   transport_value(transports[conflict->first], key) + "; " + why +
                   " (a job without classes takes class 0)");
  }
  options.transports.assign(transports.begin(), transports.end());
  options.transport_of_rank.clear();
  for (int j : job_of_device(placements, world)) {
    options.transport_of_rank.push_back(static_cast<std::uint16_t>(std::max(j, 0)));
  }
}

JobsResult simulate_jobs(const hw::ClusterSpec& cluster, std::vector<strategies::Experiment> jobs,
                         std::string_view placement, bool stop_on_oom) {
  if (jobs.empty()) throw BadInput("simulate_jobs: no jobs");
  JobsResult out;
  std::vector<int> sizes;
  for (const auto& job : jobs) {
    sizes.push_back(job.cluster.world_size());
    std::string name = job.name;
    int same = 1;
    for (const auto& n : out.names) same += n.rfind(job.name, 0) == 0 ? 1 : 0;
    if (same > 1) name += "#" + std::to_string(same);
    out.names.push_back(name);
  }
  try {
    out.placements = place_jobs(sizes, placement, cluster);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    for (std::int32_t d : out.placements[j].devices) {
      const auto& device = cluster.device_of(d);
      if (device.name != jobs[j].cluster.device.name) {
        throw BadInput("job " + out.names[j] + " runs on " + jobs[j].cluster.device.name +
                       ", but device " + std::to_string(d) + " of cluster " + cluster.name +
                       " is " + device.name);
      }
    }
    if (jobs[j].memory.fragmentation != jobs[0].memory.fragmentation ||
        jobs[j].memory.reserved != jobs[0].memory.reserved ||
        jobs[j].memory.cuda_context != jobs[0].memory.cuda_context ||
        jobs[j].memory.nccl_buffers != jobs[0].memory.nccl_buffers) {
      throw BadInput("jobs " + out.names[0] + " and " + out.names[j] +
                     " set different memory overheads (memory.fragmentation, memory.reserved, "
                     "memory.cuda_context, memory.nccl_buffers); "
                     "jobs simulated together share them");
    }
  }
  sim::SimOptions options;
  {
    std::vector<strategies::TransportPolicy> transports;
    for (const auto& e : jobs) transports.push_back(e.transport);
    set_job_transports(options, transports, out.placements, out.names, cluster.world_size());
  }
  for (auto& e : jobs) {
    Result r;
    r.program = study::lower(e, {.mirror_data_parallel = false});
    r.context = traces::report_context(e);
    r.experiment = std::move(e);
    out.jobs.push_back(std::move(r));
  }
  std::vector<const strategies::Program*> pointers;
  for (const auto& r : out.jobs) pointers.push_back(&r.program);
  const auto merged = merge_programs(pointers, out.placements, out.names, cluster.world_size());
  options.overheads = memory_overheads(out.jobs.front().experiment);
  options.stop_on_oom = stop_on_oom;
  JobLosses losses(out.placements, cluster.world_size());
  const bool lossy = std::any_of(out.jobs.begin(), out.jobs.end(), [](const Result& r) {
    return r.experiment.transport.loss_bound > 0;
  });
  if (lossy) options.observers.push_back(&losses);
  std::vector<traces::LinkLoad> links;
  out.merged = simulate_program(merged, cluster, options, &links);
  for (std::size_t j = 0; j < out.jobs.size(); ++j) {
    Result& r = out.jobs[j];
    // Jobs are lowered with one iteration each.
    if (r.experiment.transport.loss_bound > 0) add_loss_figures(r.context, losses.losses[j], 1);
    r.timeline = split_timeline(out.merged, merged, r.program, out.placements[j]);
    // Replicas of one job are not a symmetry of a fabric that other jobs share.
    if (cluster.network_model == hw::NetworkModel::flow &&
        cluster.flow_symmetry != hw::FlowSymmetry::off) {
      r.context.setup.emplace_back("flow symmetry",
                                   "every replica simulated: several jobs share the fabric");
    }
    r.report = traces::make_report(r.program, r.timeline, r.context);
    r.report.links = links;
  }
  return out;
}

}  // namespace stratasim::study
