#include "strategies/schedule.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <limits>
#include <stdexcept>
#include <tuple>

namespace stratasim::strategies {

std::string_view name_of(PassKind k) {
  switch (k) {
    case PassKind::forward:
      return "F";
    case PassKind::backward:
      return "B";
    case PassKind::weight:
      return "W";
    case PassKind::recompute:
      return "R";
  }
  return "?";
}

std::vector<int> Schedule::chunks_of(int device) const {
  std::vector<int> out;
  for (int c = 0; c < chunks; ++c) {
    if (device_of_chunk[static_cast<std::size_t>(c)] == device) out.push_back(c);
  }
  return out;
}

int schedule_parts(ScheduleKind kind, int stages, const ScheduleOptions& options) {
  switch (kind) {
    case ScheduleKind::interleaved:
      return stages * options.virtual_stages;
    case ScheduleKind::zb_v:
      return 2 * stages;
    default:
      return stages;
  }
}

std::optional<std::string> schedule_constraint(ScheduleKind kind, int p, int m,
                                               const ScheduleOptions& options) {
  const std::string name(name_of(kind));
  if (p < 1 || m < 1) return "a pipeline needs at least one stage and one microbatch";
  if (options.virtual_stages < 1 || options.sequence_slices < 1) {
    return "virtual_stages and sequence_slices must be at least 1";
  }
  if (kind != ScheduleKind::interleaved && options.virtual_stages != 1) {
    return "virtual_stages (" + std::to_string(options.virtual_stages) +
           ") applies to the interleaved schedule only, not " + name;
  }
  if (kind != ScheduleKind::terapipe && options.sequence_slices != 1) {
    return "sequence_slices (" + std::to_string(options.sequence_slices) +
           ") applies to the terapipe schedule only, not " + name;
  }
  switch (kind) {
    case ScheduleKind::interleaved:
      if (m % p != 0) {
        return "interleaved needs the microbatches (" + std::to_string(m) +
               ") to be a multiple of the pipeline stages (" + std::to_string(p) + ")";
      }
      break;
    case ScheduleKind::pipedream_2bw:
      if (m < p) {
        return "pipedream-2bw needs at least as many microbatches (" + std::to_string(m) +
               ") as pipeline stages (" + std::to_string(p) + ") to keep the pipeline full";
      }
      break;
    case ScheduleKind::chimera:
      if (p % 2 != 0 || m % 2 != 0) {
        return "chimera needs an even number of pipeline stages (" + std::to_string(p) +
               ") and of microbatches (" + std::to_string(m) + "), half for each direction";
      }
      break;
    case ScheduleKind::dualpipe:
      if (p % 2 != 0 || m % 2 != 0 || m < 2 * p) {
        return "dualpipe needs an even number of pipeline stages (" + std::to_string(p) +
               ") and an even number of microbatches (" + std::to_string(m) +
               "), half for each direction, at least twice the stages";
      }
      break;
    default:
      break;
  }
  if (static_cast<std::int64_t>(m) * options.sequence_slices > (1 << 24)) {
    return "more than 16,777,216 microbatch slices";
  }
  return std::nullopt;
}

namespace {

// One chain of `chunks` chunks in order; chunk c on device device(c).
template <class Device>
void chain_layout(Schedule& s, int chunks, Device device) {
  s.chunks = chunks;
  s.parts = chunks;
  for (int c = 0; c < chunks; ++c) {
    s.device_of_chunk.push_back(device(c));
    s.part_of_chunk.push_back(c);
    s.next_chunk.push_back(c + 1 < chunks ? c + 1 : -1);
    s.prev_chunk.push_back(c - 1);
  }
}

Pass pass(PassKind kind, int unit, int chunk) {
  return Pass{kind, static_cast<std::int32_t>(unit), static_cast<std::int16_t>(chunk)};
}

// 1F1B-family orders of one device holding chunk `c`: `warmup` forwards, then per step the
// steps of `steady` (forward / backward, weights as `lag` allows), then the drain.
// Zero Bubble's W passes follow their B by `lag` backwards: W(i) is issued once more than
// `lag` weight passes are pending.
std::vector<Pass> one_f_one_b_order(int m, int c, int warmup, bool split, int lag,
                                    bool backward_first_after_warmup) {
  std::vector<Pass> out;
  warmup = std::clamp(warmup, 0, m);
  std::deque<int> pending;
  int next_forward = 0, next_backward = 0;
  auto forward = [&] { out.push_back(pass(PassKind::forward, next_forward++, c)); };
  auto backward = [&] {
    out.push_back(pass(PassKind::backward, next_backward, c));
    if (split) {
      pending.push_back(next_backward);
      while (static_cast<int>(pending.size()) > lag) {
        out.push_back(pass(PassKind::weight, pending.front(), c));
        pending.pop_front();
      }
    }
    ++next_backward;
  };
  while (next_forward < warmup) forward();
  while (next_backward < m) {
    if (backward_first_after_warmup) {
      backward();
      if (next_forward < m) forward();
    } else {
      if (next_forward < m) forward();
      backward();
    }
  }
  for (int w : pending) out.push_back(pass(PassKind::weight, w, c));
  return out;
}

// Megatron-LM's interleaved order for device s (forward_backward_pipelining_with_interleaving).
std::vector<Pass> interleaved_order(int p, int m, int v, int s) {
  const int total = m * v;
  const int warmup = std::min((p - s - 1) * 2 + (v - 1) * p, total);
  auto unit_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward = [&](int k) {
    const int chunk = (k % (p * v)) / p;
    return pass(PassKind::forward, unit_of(k), chunk * p + s);
  };
  auto backward = [&](int k) {
    const int chunk = v - 1 - (k % (p * v)) / p;
    return pass(PassKind::backward, unit_of(k), chunk * p + s);
  };
  std::vector<Pass> out;
  for (int k = 0; k < warmup; ++k) out.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(forward(warmup + i));
    out.push_back(backward(i));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(backward(k));
  return out;
}

// List scheduling of unit-time passes: every device runs, whenever it is free, the ready pass
// of smallest (start time, kind rank, unit, chunk); a device starts no forward while `limit`
// of its forwards await their backward. Gives per-device orders that follow one feasible
// execution, hence deadlock-free whatever the real durations.
struct ListScheduling {
  std::int64_t forward = 1, backward = 2, weight = 1;
  int rank_forward = 0, rank_backward = 1, rank_weight = 2;  // lower runs first on ties
  int limit = std::numeric_limits<int>::max();
};

void list_schedule(Schedule& s, const ListScheduling& how) {
  const int units = s.units();
  const int chunks = s.chunks;
  const auto idx = [chunks](int unit, int chunk) {
    return static_cast<std::size_t>(unit) * static_cast<std::size_t>(chunks) +
           static_cast<std::size_t>(chunk);
  };
  constexpr std::int64_t kNotDone = -1;
  std::vector<std::int64_t> f_done(static_cast<std::size_t>(units) * chunks, kNotDone);
  std::vector<std::int64_t> b_done(f_done.size(), kNotDone);
  std::vector<std::int64_t> free_at(static_cast<std::size_t>(s.stages), 0);
  std::vector<int> in_flight(static_cast<std::size_t>(s.stages), 0);
  // Candidates: passes whose dependencies are done, with the time they became ready.
  struct Candidate {
    PassKind kind;
    int unit, chunk;
    std::int64_t ready;
  };
  std::vector<std::vector<Candidate>> ready(static_cast<std::size_t>(s.stages));
  auto offer = [&](PassKind kind, int unit, int chunk, std::int64_t at) {
    ready[static_cast<std::size_t>(s.device_of_chunk[static_cast<std::size_t>(chunk)])].push_back(
        {kind, unit, chunk, at});
  };
  // Units enter their chain's first chunk in order: unit u's first forward is offered once
  // the previous unit of the same chain has started there.
  std::vector<int> next_unit_of_chain(static_cast<std::size_t>(chunks), -1);
  auto next_entry = [&](int chain_start, int after) {
    for (int u = after + 1; u < units; ++u) {
      if (s.first_chunk_of(u) == chain_start) return u;
    }
    return -1;
  };
  for (int c = 0; c < chunks; ++c) {
    if (s.prev_chunk[static_cast<std::size_t>(c)] >= 0) continue;
    const int u = next_entry(c, -1);
    if (u >= 0) offer(PassKind::forward, u, c, 0);
  }
  const std::size_t total = static_cast<std::size_t>(units) * static_cast<std::size_t>(chunks) *
                            (s.split_backward ? 3u : 2u) /
                            static_cast<std::size_t>(s.first_chunk.empty() ? 1 : 2);
  std::size_t scheduled = 0;
  while (scheduled < total) {
    int best_device = -1;
    std::size_t best_index = 0;
    std::tuple<std::int64_t, int, int, int> best_key{};
    for (int d = 0; d < s.stages; ++d) {
      const auto& list = ready[static_cast<std::size_t>(d)];
      for (std::size_t i = 0; i < list.size(); ++i) {
        const Candidate& c = list[i];
        if (c.kind == PassKind::forward && in_flight[static_cast<std::size_t>(d)] >= how.limit)
          continue;
        const int rank = c.kind == PassKind::forward    ? how.rank_forward
                         : c.kind == PassKind::backward ? how.rank_backward
                                                        : how.rank_weight;
        const std::tuple<std::int64_t, int, int, int> key{
            std::max(c.ready, free_at[static_cast<std::size_t>(d)]), rank, c.unit, c.chunk};
        if (best_device < 0 || key < best_key) {
          best_device = d;
          best_index = i;
          best_key = key;
        }
      }
    }
    if (best_device < 0) {
      throw std::logic_error("list scheduling of " + std::string(name_of(s.kind)) +
                             " is stuck (in-flight limit too small)");
    }
    auto& list = ready[static_cast<std::size_t>(best_device)];
    const Candidate c = list[best_index];
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(best_index));
    const std::int64_t start = std::get<0>(best_key);
    const std::int64_t duration = c.kind == PassKind::forward    ? how.forward
                                  : c.kind == PassKind::backward ? how.backward
                                                                 : how.weight;
    const std::int64_t end = start + duration;
    free_at[static_cast<std::size_t>(best_device)] = end;
    s.passes[static_cast<std::size_t>(best_device)].push_back(pass(c.kind, c.unit, c.chunk));
    ++scheduled;
    const int next = s.next_chunk[static_cast<std::size_t>(c.chunk)];
    const int prev = s.prev_chunk[static_cast<std::size_t>(c.chunk)];
    switch (c.kind) {
      case PassKind::forward: {
        ++in_flight[static_cast<std::size_t>(best_device)];
        f_done[idx(c.unit, c.chunk)] = end;
        if (prev < 0) {  // the chain's next unit may enter
          const int u = next_entry(c.chunk, c.unit);
          if (u >= 0) offer(PassKind::forward, u, c.chunk, start);
        }
        if (next >= 0) {
          offer(PassKind::forward, c.unit, next, end);
        } else {
          offer(PassKind::backward, c.unit, c.chunk, end);
        }
        break;
      }
      case PassKind::backward:
        // With split backward W still holds activations: the forward stays in flight until it.
        if (!s.split_backward) --in_flight[static_cast<std::size_t>(best_device)];
        b_done[idx(c.unit, c.chunk)] = end;
        if (s.split_backward) offer(PassKind::weight, c.unit, c.chunk, end);
        if (prev >= 0) offer(PassKind::backward, c.unit, prev, end);
        break;
      case PassKind::weight:
        --in_flight[static_cast<std::size_t>(best_device)];
        break;
      default:
        break;
    }
  }
}

// Two pipelines over the same p parts in opposite directions (Chimera, DualPipe): chunks
// 0..p-1 the down pipeline (part c on device c), p..2p-1 the up pipeline (part c - p on device
// 2p - 1 - c); even units run down, odd units up; device d's parts are summed with device
// p - 1 - d's.
void bidirectional_layout(Schedule& s) {
  const int p = s.stages;
  s.chunks = 2 * p;
  s.parts = p;
  for (int c = 0; c < 2 * p; ++c) {
    const int part = c % p;
    s.device_of_chunk.push_back(c < p ? c : 2 * p - 1 - c);
    s.part_of_chunk.push_back(part);
    s.next_chunk.push_back(part + 1 < p ? c + 1 : -1);
    s.prev_chunk.push_back(part > 0 ? c - 1 : -1);
  }
  for (int u = 0; u < s.microbatches; ++u) s.first_chunk.push_back(u % 2 == 0 ? 0 : p);
  for (int d = 0; d < p; ++d) s.replica_device.push_back(p - 1 - d);
}

// DualPipe's order for device d, step by step as the reference DualPipe.step() issues it
// (schedule.hpp). Phase 0 is the direction whose start the device is nearer: the down
// pipeline on the first half of the devices, the up one on the second half.
void dualpipe_order(Schedule& s, int d) {
  const int p = s.stages, half_ranks = p / 2, half_chunks = s.microbatches / 2;
  const int h = std::min(d, p - 1 - d);
  const bool second_half = d >= half_ranks;
  const bool middle = d == half_ranks - 1 || d == half_ranks;
  // The chunk this device runs in each phase, and the next unit of each phase's direction.
  const std::array<int, 2> down_up = {d, 2 * p - 1 - d};
  const std::array<int, 2> chunk = {down_up[second_half ? 1 : 0], down_up[second_half ? 0 : 1]};
  const std::array<int, 2> parity = {second_half ? 1 : 0, second_half ? 0 : 1};
  std::array<int, 2> next_f{}, next_b{};
  std::deque<Pass> weights;  // split backwards awaiting their W, oldest first
  auto& out = s.passes[static_cast<std::size_t>(d)];
  auto& pair = s.overlap_next[static_cast<std::size_t>(d)];
  auto add = [&](Pass x) {
    out.push_back(x);
    pair.push_back(false);
  };
  auto forward = [&](int phase) {
    const auto i = static_cast<std::size_t>(phase);
    add(pass(PassKind::forward, 2 * next_f[i]++ + parity[i], chunk[i]));
  };
  // A backward: split (its W waits in the queue) or whole (its W right after it).
  auto backward = [&](int phase, bool split) {
    const auto i = static_cast<std::size_t>(phase);
    const Pass b = pass(PassKind::backward, 2 * next_b[i]++ + parity[i], chunk[i]);
    add(b);
    if (split) {
      weights.push_back(pass(PassKind::weight, b.microbatch, b.chunk));
    } else {
      add(pass(PassKind::weight, b.microbatch, b.chunk));
    }
  };
  auto weight = [&] {
    add(weights.front());
    weights.pop_front();
  };
  auto overlapped = [&](int f_phase, int b_phase) {  // F&B: a forward paired with a backward
    forward(f_phase);
    pair.back() = true;
    backward(b_phase, false);
  };
  for (int i = 0; i < 2 * (half_ranks - h - 1); ++i) forward(0);  // 1: nF0
  for (int i = 0; i < h + 1; ++i) {                               // 2: nF0F1
    forward(0);
    forward(1);
  }
  for (int i = 0; i < half_ranks - h - 1; ++i) {  // 3: nB1W1F1, zero bubble
    backward(1, true);
    weight();
    forward(1);
  }
  for (int i = 0; i < half_chunks - p + h + 1; ++i) {  // 4: nF0B1F1B0, the main step
    if (i == 0 && middle) {                            // not overlapped, to shorten the bubble
      forward(0);
      backward(1, false);
    } else {
      overlapped(0, 1);
    }
    overlapped(1, 0);
  }
  for (int i = 0; i < half_ranks - h - 1; ++i) {  // 5: nB1F1B0
    backward(1, false);
    overlapped(1, 0);
  }
  bool split = false;  // 6: nB1B0, the second half of them split
  for (int i = 0; i < h + 1; ++i) {
    if (i == (h + 1) / 2 && h % 2 == 1) split = true;
    backward(1, split);
    if (i == (h + 1) / 2 && h % 2 == 0) split = true;
    backward(0, split);
  }
  for (int i = 0; i < half_ranks - h - 1; ++i) {  // 7: nWB0, zero bubble
    weight();
    backward(0, true);
  }
  while (!weights.empty()) weight();  // 8: nW
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int p, int m, const ScheduleOptions& options) {
  if (auto problem = schedule_constraint(kind, p, m, options)) {
    throw std::invalid_argument(*problem);
  }
  Schedule s;
  s.kind = kind;
  s.stages = p;
  s.microbatches = m;
  s.passes.resize(static_cast<std::size_t>(p));
  auto device_is_chunk = [](int c) { return c; };
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::terapipe: {
      chain_layout(s, p, device_is_chunk);
      s.slices = kind == ScheduleKind::terapipe ? options.sequence_slices : 1;
      const int units = s.units();
      for (int d = 0; d < p; ++d) {
        auto& out = s.passes[static_cast<std::size_t>(d)];
        for (int u = 0; u < units; ++u) out.push_back(pass(PassKind::forward, u, d));
        for (int mb = 0; mb < m; ++mb) {  // slices of a microbatch backwards in reverse
          for (int slice = s.slices - 1; slice >= 0; --slice) {
            out.push_back(pass(PassKind::backward, mb * s.slices + slice, d));
          }
        }
      }
      break;
    }
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::merak_scp:
      chain_layout(s, p, device_is_chunk);
      for (int d = 0; d < p; ++d) {
        auto order = one_f_one_b_order(m, d, p - d - 1, false, 0, false);
        if (kind == ScheduleKind::merak_scp) {
          std::vector<Pass> shifted;
          for (const Pass& x : order) {
            if (x.kind == PassKind::backward) {
              shifted.push_back(pass(PassKind::recompute, x.microbatch, x.chunk));
            }
            shifted.push_back(x);
          }
          order = std::move(shifted);
        }
        s.passes[static_cast<std::size_t>(d)] = std::move(order);
      }
      break;
    case ScheduleKind::zb_h1:
      chain_layout(s, p, device_is_chunk);
      s.split_backward = true;
      for (int d = 0; d < p; ++d) {
        s.passes[static_cast<std::size_t>(d)] = one_f_one_b_order(m, d, p - d - 1, true, d, false);
      }
      break;
    case ScheduleKind::zb_h2:
      chain_layout(s, p, device_is_chunk);
      s.split_backward = true;
      s.overlapping_iterations = true;
      for (int d = 0; d < p; ++d) {
        s.passes[static_cast<std::size_t>(d)] =
            one_f_one_b_order(m, d, 2 * (p - d - 1) + 1, true, 2 * d, true);
      }
      break;
    case ScheduleKind::pipedream_2bw: {
      chain_layout(s, p, device_is_chunk);
      s.overlapping_iterations = true;
      s.weight_versions = 2;
      for (int d = 0; d < p; ++d) {
        const int lag = p - 1 - d;
        s.carried_backwards.push_back(lag);
        auto& out = s.passes[static_cast<std::size_t>(d)];
        for (int k = 0; k < m; ++k) {
          out.push_back(pass(PassKind::forward, k, d));
          const int b = k - lag;
          out.push_back(pass(PassKind::backward, b >= 0 ? b : b + m, d));
        }
      }
      break;
    }
    case ScheduleKind::interleaved: {
      const int v = options.virtual_stages;
      chain_layout(s, p * v, [p](int c) { return c % p; });
      for (int d = 0; d < p; ++d)
        s.passes[static_cast<std::size_t>(d)] = interleaved_order(p, m, v, d);
      s.batched_p2p = options.batched_p2p;
      for (int d = 0; d < p && s.batched_p2p; ++d) {
        // As interleaved_order: the warm-up forwards, then forward-backward pairs.
        const int total = m * v, warmup = std::min((p - d - 1) * 2 + (v - 1) * p, total);
        s.steady_begin.push_back(warmup);
        s.steady_end.push_back(warmup + 2 * (total - warmup));
      }
      break;
    }
    case ScheduleKind::zb_v: {
      chain_layout(s, 2 * p, [p](int c) { return c < p ? c : 2 * p - 1 - c; });
      s.split_backward = true;
      ListScheduling how;
      how.forward = how.backward = how.weight = 1;
      how.rank_backward = 0;
      how.rank_forward = 1;
      how.rank_weight = 2;
      how.limit = 2 * p;
      list_schedule(s, how);
      break;
    }
    case ScheduleKind::dualpipe:
      bidirectional_layout(s);
      s.split_backward = true;
      s.overlap_next.resize(static_cast<std::size_t>(p));
      for (int d = 0; d < p; ++d) dualpipe_order(s, d);
      if (!options.overlap_pairs) s.overlap_next.clear();
      break;
    case ScheduleKind::chimera: {
      bidirectional_layout(s);
      ListScheduling how;  // Chimera's forward-first order, backward twice the forward
      how.forward = 1;
      how.backward = 2;
      how.limit = 2 * p;  // at most 2p forwards in flight per device (both directions)
      list_schedule(s, how);
      break;
    }
  }
  if (s.carried_backwards.empty()) s.carried_backwards.assign(static_cast<std::size_t>(p), 0);
  return s;
}

std::vector<std::vector<Pass>> pipeline_schedule(ScheduleKind kind, int stages, int microbatches,
                                                 const ScheduleOptions& options) {
  return make_schedule(kind, stages, microbatches, options).passes;
}

}  // namespace stratasim::strategies
