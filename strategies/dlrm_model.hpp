// A recommendation model of the DLRM family (Naumov et al., "Deep Learning Recommendation
// Model for Personalization and Recommendation Systems", arXiv:1906.00091; MLPerf's DLRM and
// DLRM-DCNv2): dense features through a bottom MLP, sparse features through embedding tables
// (one pooled lookup of `pooling` ids per sample per table), their feature interaction (pairwise
// dots, a concatenation, or DCNv2's cross layers), a top MLP and the loss.
// strategies/dlrm.hpp lowers it; docs/recommendation.md describes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hw_models/dtype.hpp"

namespace stratasim::strategies {

/// One embedding table: `rows` x `dim` weights, `pooling` ids looked up per sample (summed).
struct EmbeddingTable {
  std::int64_t rows = 0;
  int dim = 0;
  int pooling = 1;
};

/// How the sparse features' outputs combine with the bottom MLP's: DLRM's pairwise dot
/// products (the lower triangle, without the diagonal), a concatenation, or DCNv2's stack of
/// `cross_layers` full-rank cross layers x_{l+1} = x_0 * (W_l x_l + b_l) + x_l.
enum class Interaction : std::uint8_t { dot, cat, dcn };

struct DlrmModel {
  std::string name;
  std::string source;
  int dense_features = 0;
  std::vector<int> bottom_mlp;  // output widths; the last is the embedding dim
  std::vector<EmbeddingTable> tables;
  Interaction interaction = Interaction::dot;
  int cross_layers = 0;  // dcn only
  /// dcn only: DCNv2's low-rank cross layers, W_l = U_l V_l^T of rank `cross_rank` (TorchRec's
  /// LowRankCrossNet; MLPerf DLRM-DCNv2 runs 512); 0: full-rank W_l.
  int cross_rank = 0;
  std::vector<int> top_mlp;  // output widths; the last is 1 (the click logit)
  DType embedding_dtype = DType::fp32;
};

/// How embedding tables are sharded over the GPUs (TorchRec's sharding types): whole tables
/// per GPU, rows split over GPUs, or the embedding dimension split over GPUs.
enum class EmbeddingSharding : std::uint8_t { table, row, column };

}  // namespace stratasim::strategies
