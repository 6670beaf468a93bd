// RNN lowering: a recurrent network (strategies/rnn_model.hpp) trained by back-propagation
// through time or by ADMMiRNN (training.algorithm), data parallel over the GPUs, becomes a
// Program of per-timestep kernels. docs/rnn.md has the kernel tables; in short (B samples per
// rank, T steps, input I_l of layer l, hidden H, G gate blocks, D directions, output O; FLOPs
// are 2 per multiply-add):
//
// BPTT (training.algorithm "bptt"): per microbatch of b = micro_batch samples, per layer and
// direction the input projection of all T steps as one GEMM, then per step the recurrent GEMM
// and the gate kernel; the output layer and loss over all steps; the backward in reverse (output
// layer, then layers from the top, steps from the last) with dgrad and wgrad GEMMs. Forward
// FLOPs per sample F = sum_l D 2 T G H (I_l + H) + 2 T O D H; an iteration costs 3 F per sample.
// Gradients accumulate over the microbatches; on the last, each layer's (and the output
// layer's) are all-reduced over the dp group as soon as its wgrads end (after the backward
// without parallelism.dp_overlap), in the gradient buffers' dtype; then one OptimizerStep.
// Memory: parameters, gradients and optimizer states as initial memory; each step's gates, h
// and c (b (G + 2) H elements) allocated by its forward and freed by its backward, the logits
// (b T O) likewise.
//
// ADMMiRNN (training.algorithm "admm"; Tang et al., ECML-PKDD 2020, arXiv:2006.05622): the
// vanilla cell, one layer, one direction. Each iteration updates U, W, b, a_t, h_t, V, c, o_t
// and the dual lambda_t in that order over all B = global_batch / dp samples of the rank, U, W,
// V, a_t and h_t by the paper's quadratic approximation (no linear solve), b, c and o_t in
// closed form: 4 B T (H I + 2 H^2 + 2 H O) FLOPs per rank, and five blocking all-reduces of the
// weights' summed terms (H I, H^2, H, O H, O elements in the training dtype). The per-sample
// variables are resident activations; no optimizer states.
//
// With mirror_data_parallel, rank 0 issues the ops and every other rank mirrors it
// (Program::set_replica); the dp group spans all ranks.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "strategies/experiment.hpp"
#include "strategies/program.hpp"
#include "strategies/rnn_model.hpp"

namespace stratasim::strategies {

/// Reads `model.type: "rnn"` at `path`: name, source, cell ("lstm", "gru", "vanilla"; default
/// lstm), layers, hidden, timesteps, input_size, output_size (each at least 1), bidirectional
/// (default false); other keys are refused. Throws config::ConfigError naming the key.
RnnModel read_rnn_model(config::Document& doc, const std::string& path);

/// The experiment's checks and resolved values for an RNN model (after the shared resolution of
/// dp and the batch): tp, pp, cp, ep and etp must be 1; parallelism and training keys other than
/// those an RNN uses are refused (those sweeps set are accepted at their "off" value);
/// training.seq_len is set to model.timesteps when left out (tokens count timesteps) and must
/// equal it when given; ADMM needs the vanilla cell, one layer, one direction and no optimizer.
/// Adds "note:" lines to `notes`. Throws config::ConfigError naming the key.
void check_rnn_experiment(const config::Document& doc, Experiment& e,
                          std::vector<std::string>& notes);

/// One training iteration of the RNN experiment; `mirror_data_parallel`: replicas other than
/// rank 0 mirror it (Program::set_replica).
Program lower_rnn(const Experiment& e, bool mirror_data_parallel = false);

/// The report's setup lines for an RNN experiment: model, parallelism, training.
std::vector<std::pair<std::string, std::string>> rnn_setup(const Experiment& e);

}  // namespace stratasim::strategies
