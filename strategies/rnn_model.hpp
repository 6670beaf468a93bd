// A recurrent network (LSTM, GRU or a vanilla tanh RNN): `layers` stacked cells of `hidden`
// units unrolled over `timesteps`, `input_size` features per step, optionally bidirectional,
// and an output layer of `output_size`. strategies/rnn.hpp lowers it, trained by back-
// propagation through time or by ADMMiRNN's updates; docs/rnn.md describes both.
#pragma once

#include <cstdint>
#include <string>

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
};

/// training.algorithm: back-propagation (through time, for an RNN), or ADMMiRNN's alternating
/// direction method of multipliers (Tang et al., arXiv:2006.05622).
enum class TrainingAlgorithm : std::uint8_t { backprop, admm };

}  // namespace stratasim::strategies
