// Data parallelism with parameter servers: the workers' pushes and pulls, and the servers' ranks
// (the contract is ParameterServer's, in strategies/lowering/techniques.hpp).
#include <algorithm>
#include <array>
#include <numeric>
#include <string>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"
#include "strategies/optimizer.hpp"

namespace stratasim::strategies {

std::vector<int> ParameterServer::assign_units(const std::vector<GradUnit>& units, int servers) {
  std::vector<std::size_t> order(units.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // The largest first; equal sizes in backward order (stable).
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return units[a].parameters > units[b].parameters;
  });
  std::vector<std::int64_t> held(static_cast<std::size_t>(servers), 0);
  std::vector<int> server(units.size(), -1);
  for (std::size_t u : order) {
    if (units[u].parameters <= 0) continue;
    const auto least =
        static_cast<std::size_t>(std::min_element(held.begin(), held.end()) - held.begin());
    server[u] = static_cast<int>(least);
    held[least] += units[u].parameters;
  }
  return server;
}

// The units' slices (Parallelism::slice_parameters): a unit of more than `slice` parameters
// becomes ceil(P / slice) slices of `slice` parameters, the last one smaller; 0 keeps units whole.
std::vector<GradUnit> ParameterServer::slice_units(const std::vector<GradUnit>& units,
                                                   std::int64_t slice) {
  std::vector<GradUnit> out;
  for (const GradUnit& u : units) {
    if (slice <= 0 || u.parameters <= slice) {
      out.push_back(u);
      continue;
    }
    const std::int64_t count = (u.parameters + slice - 1) / slice;
    for (std::int64_t k = 0; k < count; ++k) {
      GradUnit part = u;
      part.name = u.name + " slice " + std::to_string(k + 1) + "/" + std::to_string(count);
      part.parameters = std::min(slice, u.parameters - k * slice);
      part.expert_parameters = 0;
      part.low_precision_parameters = 0;
      out.push_back(std::move(part));
    }
  }
  return out;
}

ParameterServer::ParameterServer(Assembly& assembly) : assembly_(assembly) {
  const PipelineSpec& spec = assembly.spec;
  if (assembly.templates.size() != 1 || spec.layout.pp != 1 || spec.layout.tp != 1) {
    throw std::invalid_argument(
        "assemble_pipeline: parameter servers need one pipeline stage and no tensor "
        "parallelism (parallelism.data_parallel)");
  }
  const StageTemplate& st = assembly.templates.front();
  const std::vector<GradUnit> whole = dense_units(st.plan.grad_units);
  const ModelStateFormat format = spec.state_format();
  const bool fp32_grads = size_of(format.grad_dtype) == 4 || format.fp32_grad_copy;
  const std::int64_t workers = spec.layout.world_size();
  const std::int64_t g = assembly.grad_element_size;
  Program& program = assembly.program;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    const std::vector<GradUnit> slices = slice_units({whole[i]}, spec.ps_slice_parameters);
    for (const GradUnit& gu : slices) {
      if (gu.parameters <= 0) continue;
      Unit u;
      u.parameters = gu.parameters;
      u.grad_unit = i;
      if (gu.layer >= 0) {
        u.layer_begin = static_cast<std::int16_t>(gu.layer);
        u.layer_end = static_cast<std::int16_t>(gu.layer + 1);
      }
      u.push_label = program.intern_label("ps push " + gu.name);
      u.pull_label = program.intern_label("ps pull " + gu.name);
      u.receive_label = program.intern_label("ps receive " + gu.name);
      u.update_label = program.intern_label("ps update " + gu.name);
      u.send_label = program.intern_label("ps send " + gu.name);
      const std::int64_t summed = u.parameters * workers;
      u.update_kernels = program.add_kernels(
          {Kernel{Elementwise{summed, Bytes(summed * g), Bytes(u.parameters * g)}, "ps sum"},
           Kernel{OptimizerStep{u.parameters, format.optimizer, format.dtype, false, fp32_grads},
                  std::string(name_of(format.optimizer))}});
      units_.push_back(u);
    }
  }
  std::vector<GradUnit> sized(units_.size());
  for (std::size_t k = 0; k < units_.size(); ++k) sized[k].parameters = units_[k].parameters;
  const std::vector<int> server = assign_units(sized, spec.parameter_servers);
  for (std::size_t k = 0; k < units_.size(); ++k) units_[k].server = server[k];
}

// Pushes and pulls are handed to the framework's communication threads: detached sends, several
// in flight at once, so that the links' scheduling (strategies/transport.hpp) orders them.
Send ParameterServer::detached(std::int32_t peer, Bytes bytes) {
  Send s{peer, bytes};
  s.eager = true;
  s.detached = true;
  return s;
}

OpInfo ParameterServer::info(const Unit& u, Stream stream, Phase phase, std::uint32_t label) const {
  OpInfo i{stream, phase, -1, u.layer_begin, u.layer_end, {}};
  i.label_id = label;
  return i;
}

OpCount ParameterServer::count_chunk(int) const {
  return {2 * units_.size(), 0};
}

void ParameterServer::gradients_complete(RankEmitter& rank, std::size_t slot) {
  const std::int32_t workers = assembly_.spec.layout.world_size();
  last_pull_.reset();
  for (const Unit& u : units_) {
    const std::array<OpId, 1> after = {assembly_.spec.dp_overlap ? rank.unit_done[slot][u.grad_unit]
                                                                 : rank.last_backward[slot]};
    rank.last_dp_comm = rank.program.add(
        detached(workers + u.server, Bytes(u.parameters * assembly_.grad_element_size)),
        info(u, Stream::dp_comm, Phase::other, u.push_label), after);
  }
  // Pulls in forward order, the order the next forward needs them; the servers, event-driven,
  // send them in the same order (emit_server).
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
    last_pull_ =
        rank.program.add(Recv{workers + it->server, Bytes(it->parameters * assembly_.element_size)},
                         info(*it, Stream::pp_recv, Phase::optimizer, it->pull_label));
  }
}

std::optional<OpId> ParameterServer::optimizer_step(RankEmitter&, std::size_t) {
  return last_pull_;
}

void ParameterServer::emit_server(int server) {
  Program& program = assembly_.program;
  const std::int32_t workers = assembly_.spec.layout.world_size();
  const int rank = workers + server;
  const std::int64_t g = assembly_.grad_element_size, e = assembly_.element_size;
  program.begin_rank(rank);
  program.set_event_driven(rank);  // it handles each push as it arrives (Program::event_driven)
  std::int64_t held = 0;
  for (const Unit& u : units_) held += u.server == server ? u.parameters : 0;
  program.add_initial_memory(rank,
                             {MemoryCategory::parameters, MemoryTier::device, Bytes(held * e)});
  program.add_initial_memory(rank,
                             {MemoryCategory::gradients, MemoryTier::device, Bytes(held * g)});
  program.add_initial_memory(rank, {MemoryCategory::optimizer_states, MemoryTier::device,
                                    optimizer_state_bytes(assembly_.spec.state_format(), held)});
  // Receives and updates in the workers' push order, sends in their pull order: in program
  // order (the CUDA executor's) every receive comes before any send, so no send waits on a
  // worker that waits on this server.
  std::vector<OpId> update(units_.size(), 0);
  std::vector<OpId> pushes;
  for (std::size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    if (u.server != server) continue;
    const Bytes push(u.parameters * g);
    // A push's buffer is taken when its data has arrived, and freed by the update.
    const std::array<MemoryEffect, 1> hold = {
        MemoryEffect{push, MemoryCategory::comm_buffers, MemoryTier::device, true}};
    pushes.clear();
    for (std::int32_t w = 0; w < workers; ++w) {
      pushes.push_back(program.add(
          Recv{w, push}, info(u, Stream::pp_recv, Phase::other, u.receive_label), {}, hold));
    }
    const std::array<MemoryEffect, 1> release = {MemoryEffect{
        Bytes(-push.count() * workers), MemoryCategory::comm_buffers, MemoryTier::device, true}};
    update[k] =
        program.add(Compute{u.update_kernels},
                    info(u, Stream::compute, Phase::optimizer, u.update_label), pushes, release);
  }
  for (std::size_t k = units_.size(); k-- > 0;) {
    const Unit& u = units_[k];
    if (u.server != server) continue;
    const std::array<OpId, 1> after = {update[k]};
    for (std::int32_t w = 0; w < workers; ++w) {
      program.add(detached(w, Bytes(u.parameters * e)),
                  info(u, Stream::dp_comm, Phase::optimizer, u.send_label), after);
    }
  }
}

void ParameterServer::emit_servers() {
  for (int s = 0; s < assembly_.spec.parameter_servers; ++s) emit_server(s);
}

}  // namespace stratasim::strategies
