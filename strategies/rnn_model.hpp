// A recurrent network (LSTM, GRU or a vanilla tanh RNN): `layers` stacked cells of `hidden`
// units unrolled over `timesteps`, `input_size` features per step, optionally bidirectional,
// and an output layer of `output_size`. strategies/rnn.hpp lowers it, trained by back-
// propagation through time or by ADMMiRNN's updates; docs/rnn.md describes both.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace stratasim::strategies {

enum class RnnCell : std::uint8_t { lstm, gru, vanilla };

struct RnnModel {
  std::string name;
  std::string source;
  RnnCell cell = RnnCell::lstm;
  int layers = 1;
  int hidden = 0;
  int timesteps = 0;
  int input_size = 0;
  int output_size = 0;
  bool bidirectional = false;

  /// Gate blocks of the cell: 4 for an LSTM (input, forget, cell, output), 3 for a GRU (reset,
  /// update, new), 1 for a vanilla tanh cell.
  int gates() const { return cell == RnnCell::lstm ? 4 : cell == RnnCell::gru ? 3 : 1; }
  int directions() const { return bidirectional ? 2 : 1; }
  /// Features entering layer `layer` at each step: input_size for the first, the layer below's
  /// output (hidden x directions) for the others.
  std::int64_t layer_input(int layer) const {
    return layer == 0 ? input_size : std::int64_t{hidden} * directions();
  }
  /// One layer's parameters over its directions, PyTorch's and cuDNN's layout: per direction
  /// W_x (G hidden x input), W_h (G hidden x hidden) and two bias vectors of G hidden.
  std::int64_t layer_parameters(int layer) const {
    const std::int64_t gh = std::int64_t{gates()} * hidden;
    return directions() * (gh * (layer_input(layer) + hidden) + 2 * gh);
  }
  /// The output layer: output_size x (hidden x directions) weights and output_size biases.
  std::int64_t output_parameters() const {
    return std::int64_t{output_size} * hidden * directions() + output_size;
  }
  std::int64_t parameters() const {
    std::int64_t total = output_parameters();
    for (int l = 0; l < layers; ++l) total += layer_parameters(l);
    return total;
  }
};

/// The cell's config name ("lstm", "gru", "vanilla").
inline std::string_view name_of(RnnCell c) {
  return c == RnnCell::lstm ? "lstm" : c == RnnCell::gru ? "gru" : "vanilla";
}

/// training.algorithm: back-propagation (through time, for an RNN), or ADMMiRNN's alternating
/// direction method of multipliers (Tang et al., arXiv:2006.05622).
enum class TrainingAlgorithm : std::uint8_t { backprop, admm };

}  // namespace stratasim::strategies
