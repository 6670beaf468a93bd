// Tensor parallelism beyond Megatron's 1D (parallelism.tp_mode): the device meshes of
// Colossal-AI's 2D (Optimus, SUMMA; Xu et al., arXiv:2104.05343), 2.5D (Tesseract; Wang et al.,
// arXiv:2105.14500) and 3D (Bian et al., arXiv:2105.14450) tensor parallelism, the communicator
// axes of a mesh, and how each mode shards a Linear layer. docs/tensor-parallelism.md describes
// the modes; the transformer lowering (strategies/transformer.cpp) builds the layers from them.
//
// Mesh coordinates of tensor-parallel index t (0 <= t < P, the rank's place in its tp group):
//   t = col + q * (row + q * depth)
// 1D has one axis (the whole group); 2D is a q x q mesh (depth 0), P = q^2; 2.5D stacks d such
// meshes, P = d q^2; 3D is a q x q x q cube, P = q^3. The axes a collective may run on:
// - tp:       the whole tensor-parallel group (P ranks);
// - tp_row:   one mesh row: the q ranks sharing row and depth (col varies; stride 1 in t);
// - tp_col:   one mesh column: the q ranks sharing col and depth (row varies; stride q);
// - tp_depth: the ranks sharing row and col (depth varies; d ranks for 2.5D, q for 3D,
//             stride q^2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stratasim::strategies {

enum class TpMode : std::uint8_t { one_d, two_d, two_half_d, three_d };
inline constexpr TpMode kAllTpModes[] = {TpMode::one_d, TpMode::two_d, TpMode::two_half_d,
                                         TpMode::three_d};
/// "1d", "2d", "2.5d", "3d".
std::string_view name_of(TpMode m);
std::optional<TpMode> tp_mode_from_name(std::string_view name);

/// The communicator a plan's collective or ring step runs on: the whole tp group, a mesh line of
/// tp_mode 2d, 2.5d and 3d, or a group outside the tensor-parallel mesh (a mesh has size 1 on
/// it): a mixture-of-experts layer's expert-parallel group `ep` and expert-tensor-parallel group
/// `etp` (strategies/moe.hpp; Communicators makes them), and the rank's context-parallel group
/// `cp` (strategies/context_parallel.hpp), and FP8's amax reduction group `amax` (the stage's
/// tensor-, context- and data-parallel ranks: Megatron's get_amax_reduction_group,
/// strategies/precision.hpp reduces_amax).
enum class TpAxis : std::uint8_t { tp, tp_row, tp_col, tp_depth, ep, etp, cp, amax };
inline constexpr int kTpAxisCount = 8;
/// "tp", "tp_row", "tp_col", "tp_depth", "ep", "etp", "cp", "amax".
std::string_view name_of(TpAxis a);

struct TpCoord {
  int col = 0, row = 0, depth = 0;
  bool operator==(const TpCoord&) const = default;
};

/// The mesh of P = tp devices under a mode: q (the mesh side) and d (the depth: 2.5D's
/// tp_depth, 3D's q, 1 for 2D). For 1D, q = P and d = 1 (one axis).
struct TpMesh {
  TpMode mode = TpMode::one_d;
  int p = 1;  // tensor-parallel devices
  int q = 1;  // mesh side
  int d = 1;  // depth

  bool operator==(const TpMesh&) const = default;

  TpCoord coord(int t) const;
  int index(TpCoord c) const { return c.col + q * (c.row + q * c.depth); }
  /// Ranks on one axis (1 for an axis the mode has not: every axis but tp in 1D, depth in 2D).
  int axis_size(TpAxis axis) const;
  /// The tp indices of `t`'s group on `axis`, in ring order (ascending coordinate).
  std::vector<int> axis_members(TpAxis axis, int t) const;
  /// Rows of an activation (tokens, or samples) each device holds: the batch is split over q
  /// (2D), d q (2.5D) or q^2 (3D); 1D replicates it.
  int batch_split() const;
  /// How the hidden (feature) dimension of an activation is split: 1 (1D: replicated between
  /// the Megatron pairs), q otherwise.
  int hidden_split() const { return mode == TpMode::one_d ? 1 : q; }
};

/// The mesh of `tp` devices under `mode` (depth: 2.5D's d, ignored otherwise), or why it
/// cannot be built: 2D needs tp = q^2, 2.5D tp = d q^2, 3D tp = q^3, each with q >= 2.
std::optional<std::string> tp_mesh_problem(TpMode mode, int tp, int depth = 1);
/// Throws std::invalid_argument with tp_mesh_problem()'s message.
TpMesh make_tp_mesh(TpMode mode, int tp, int depth = 1);

struct MatrixShape {
  std::int64_t rows = 0, cols = 0;
  bool operator==(const MatrixShape&) const = default;
};

/// One Linear Y[B, out] = X[B, in] W[in, out] as one device holds it: its weight shard and
/// its input and output activations.
struct LinearShard {
  MatrixShape weight, input, output;
};

/// The shards of a stack of Linears (features[0] -> features[1] -> ...) on batch `rows`, as in
/// Colossal-AI:
/// - 1D (Megatron): odd Linears column-parallel W[in, out/P] on the whole input X[B, in],
///   output [B, out/P]; even ones row-parallel W[in/P, out], output [B, out] after the
///   all-reduce;
/// - 2D: W[in/q, out/q], X[B/q, in/q], Y[B/q, out/q];
/// - 2.5D: W[in/q, out/q] (replicated over the depth), X[B/(d q), in/q], Y[B/(d q), out/q];
/// - 3D: W[in/q, out/q^2], X[B/q^2, in/q], Y[B/q^2, out/q].
/// Sizes round down: callers check divisibility (the experiment does, naming the key).
std::vector<LinearShard> linear_stack_shards(const TpMesh& mesh, std::int64_t rows,
                                             const std::vector<std::int64_t>& features);

}  // namespace stratasim::strategies
