#include "strategies/tp_modes.hpp"

#include <stdexcept>

namespace stratasim::strategies {

std::string_view name_of(TpMode m) {
  switch (m) {
    case TpMode::one_d:
      return "1d";
    case TpMode::two_d:
      return "2d";
    case TpMode::two_half_d:
      return "2.5d";
    case TpMode::three_d:
      return "3d";
  }
  return "?";
}

std::optional<TpMode> tp_mode_from_name(std::string_view name) {
  for (TpMode m : kAllTpModes) {
    if (name_of(m) == name) return m;
  }
  return std::nullopt;
}

std::string_view name_of(TpAxis a) {
  switch (a) {
    case TpAxis::tp:
      return "tp";
    case TpAxis::tp_row:
      return "tp_row";
    case TpAxis::tp_col:
      return "tp_col";
    case TpAxis::tp_depth:
      return "tp_depth";
    case TpAxis::ep:
      return "ep";
    case TpAxis::etp:
      return "etp";
    case TpAxis::cp:
      return "cp";
    case TpAxis::amax:
      return "amax";
  }
  return "?";
}

TpCoord TpMesh::coord(int t) const {
  if (mode == TpMode::one_d) return TpCoord{t, 0, 0};
  return TpCoord{t % q, (t / q) % q, t / (q * q)};
}

int TpMesh::axis_size(TpAxis axis) const {
  if (axis == TpAxis::tp) return p;
  if (mode == TpMode::one_d || axis == TpAxis::ep || axis == TpAxis::etp || axis == TpAxis::cp ||
      axis == TpAxis::amax) {
    return 1;  // outside the mesh
  }
  if (axis == TpAxis::tp_depth) return mode == TpMode::two_d ? 1 : d;
  return q;
}

std::vector<int> TpMesh::axis_members(TpAxis axis, int t) const {
  std::vector<int> members;
  if (axis == TpAxis::tp) {
    for (int i = 0; i < p; ++i) members.push_back(i);
    return members;
  }
  const TpCoord c = coord(t);
  const int n = axis_size(axis);
  for (int i = 0; i < n; ++i) {
    TpCoord m = c;
    if (axis == TpAxis::tp_row) m.col = i;
    if (axis == TpAxis::tp_col) m.row = i;
    if (axis == TpAxis::tp_depth) m.depth = i;
    members.push_back(n == 1 ? t : index(m));
  }
  return members;
}

int TpMesh::batch_split() const {
  switch (mode) {
    case TpMode::one_d:
      return 1;
    case TpMode::two_d:
      return q;
    case TpMode::two_half_d:
      return d * q;
    case TpMode::three_d:
      return q * q;
  }
  return 1;
}

namespace {

// The integer n >= 2 with n^k == value, if any.
std::optional<int> exact_root(int value, int k) {
  for (int n = 2;; ++n) {
    std::int64_t power = 1;
    for (int i = 0; i < k; ++i) power *= n;
    if (power == value) return n;
    if (power > value) return std::nullopt;
  }
}

}  // namespace

std::optional<std::string> tp_mesh_problem(TpMode mode, int tp, int depth) {
  const std::string got = ", got tp = " + std::to_string(tp);
  switch (mode) {
    case TpMode::one_d:
      return std::nullopt;
    case TpMode::two_d:
      if (!exact_root(tp, 2)) {
        return "tp_mode 2d needs tp = q^2 devices with q >= 2 (4, 9, 16, ...)" + got;
      }
      return std::nullopt;
    case TpMode::two_half_d:
      if (depth < 1) return "tp_mode 2.5d needs tp_depth >= 1, got " + std::to_string(depth);
      if (tp % depth != 0 || !exact_root(tp / depth, 2)) {
        return "tp_mode 2.5d needs tp = d * q^2 devices with d = tp_depth = " +
               std::to_string(depth) + " and q >= 2 (" + std::to_string(4 * depth) + ", " +
               std::to_string(9 * depth) + ", " + std::to_string(16 * depth) + ", ...)" + got;
      }
      return std::nullopt;
    case TpMode::three_d:
      if (!exact_root(tp, 3)) {
        return "tp_mode 3d needs tp = q^3 devices with q >= 2 (8, 27, 64, ...)" + got;
      }
      return std::nullopt;
  }
  return "unknown tp_mode";
}

TpMesh make_tp_mesh(TpMode mode, int tp, int depth) {
  if (auto problem = tp_mesh_problem(mode, tp, depth)) throw std::invalid_argument(*problem);
  TpMesh m;
  m.mode = mode;
  m.p = tp;
  switch (mode) {
    case TpMode::one_d:
      m.q = tp;
      m.d = 1;
      break;
    case TpMode::two_d:
      m.q = *exact_root(tp, 2);
      m.d = 1;
      break;
    case TpMode::two_half_d:
      m.q = *exact_root(tp / depth, 2);
      m.d = depth;
      break;
    case TpMode::three_d:
      m.q = *exact_root(tp, 3);
      m.d = m.q;
      break;
  }
  return m;
}

std::vector<LinearShard> linear_stack_shards(const TpMesh& mesh, std::int64_t rows,
                                             const std::vector<std::int64_t>& features) {
  std::vector<LinearShard> shards;
  const std::int64_t p = mesh.p, q = mesh.q;
  const std::int64_t b = rows / mesh.batch_split();
  for (std::size_t i = 0; i + 1 < features.size(); ++i) {
    const std::int64_t in = features[i], out = features[i + 1];
    LinearShard s;
    switch (mesh.mode) {
      case TpMode::one_d:
        if (i % 2 == 0) {  // column parallel
          s = {{in, out / p}, {rows, in}, {rows, out / p}};
        } else {  // row parallel, all-reduced output
          s = {{in / p, out}, {rows, in / p}, {rows, out}};
        }
        break;
      case TpMode::two_d:
      case TpMode::two_half_d:
        s = {{in / q, out / q}, {b, in / q}, {b, out / q}};
        break;
      case TpMode::three_d:
        s = {{in / q, out / (q * q)}, {b, in / q}, {b, out / q}};
        break;
    }
    shards.push_back(s);
  }
  return shards;
}

}  // namespace stratasim::strategies
