#include "strategies/kernel_bytes.hpp"

#include <type_traits>
#include <variant>

#include "hw_models/dtype.hpp"
#include "strategies/optimizer.hpp"

namespace stratasim::strategies {

Bytes gemm_memory_bytes(const Gemm& g) {
  return Bytes(packed_bytes(g.dtype, (g.m * g.k + g.k * g.n + g.m * g.n) * g.batch));
}

Bytes attention_memory_bytes(const Attention& a) {
  const std::int64_t kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  std::int64_t bytes = (2 * a.batch * a.heads * a.seq_q * a.head_dim +
                        2 * a.batch * kv_heads * a.seq_kv * a.head_dim) *
                       size_of(a.dtype);
  if (a.backward) bytes = bytes * 5 / 2;  // exact: bytes is even
  return Bytes(bytes);
}

Bytes memory_bytes(const Kernel& k) {
  return std::visit(
      [](const auto& w) -> Bytes {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, Gemm>) {
          return gemm_memory_bytes(w);
        } else if constexpr (std::is_same_v<W, Attention>) {
          return attention_memory_bytes(w);
        } else if constexpr (std::is_same_v<W, Elementwise>) {
          return w.bytes_read + w.bytes_written;
        } else if constexpr (std::is_same_v<W, OptimizerStep>) {
          return optimizer_update_bytes(w).total();
        } else if constexpr (std::is_same_v<W, Copy>) {
          return w.from == w.to ? w.bytes * 2 : w.bytes;
        } else if constexpr (std::is_same_v<W, RooflineWork>) {
          return w.bytes;
        } else {
          static_assert(std::is_same_v<W, Measured>);
          return Bytes(0);
        }
      },
      k.work);
}

}  // namespace stratasim::strategies
