// Two Programs compared op by op, every field as text (kernels, work, dependencies, memory
// effects, provenance), for the importers' round-trip tests: an exported Program must come
// back exactly.
#pragma once

#include <sstream>
#include <string>
#include <type_traits>
#include <variant>

#include <doctest/doctest.h>

#include "strategies/program.hpp"

namespace stratasim::testing {

// Every field of a kernel, as text, so two kernels compare field by field.
inline std::string text_of(const strategies::Kernel& k) {
  std::ostringstream s;
  s << k.name << ":";
  std::visit(
      [&](const auto& w) {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, strategies::Gemm>) {
          s << "gemm " << w.m << " " << w.n << " " << w.k << " " << w.batch << " "
            << name_of(w.dtype);
        } else if constexpr (std::is_same_v<W, strategies::Attention>) {
          s << "attention " << w.batch << " " << w.heads << " " << w.kv_heads << " " << w.seq_q
            << " " << w.seq_kv << " " << w.head_dim << " " << w.causal << " " << name_of(w.dtype)
            << " " << w.backward;
        } else if constexpr (std::is_same_v<W, strategies::Elementwise>) {
          s << "elementwise " << w.elements << " " << w.bytes_read.count() << " "
            << w.bytes_written.count();
        } else if constexpr (std::is_same_v<W, strategies::OptimizerStep>) {
          s << "optimizer " << w.params << " " << static_cast<int>(w.kind) << " "
            << name_of(w.dtype) << " " << w.on_host;
        } else if constexpr (std::is_same_v<W, strategies::Copy>) {
          s << "copy " << w.bytes.count() << " " << static_cast<int>(w.from) << " "
            << static_cast<int>(w.to);
        } else if constexpr (std::is_same_v<W, strategies::Measured>) {
          s << "measured " << w.duration.picoseconds();
        } else {
          s << "roofline " << w.flops.count() << " " << w.bytes.count() << " " << name_of(w.dtype);
        }
      },
      k.work);
  return s.str();
}

inline std::string text_of(const strategies::Program& p, const strategies::Op& op) {
  std::ostringstream s;
  s << "rank " << op.rank << " stream " << name_of(op.stream) << " phase " << name_of(op.phase)
    << " mb " << op.microbatch << " layers " << op.layer_begin << "-" << op.layer_end << " '"
    << p.label_of(op) << "' ";
  std::visit(
      [&](const auto& w) {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, strategies::Compute>) {
          for (const auto& k : p.kernels_of(w)) s << "[" << text_of(k) << "]";
        } else if constexpr (std::is_same_v<W, strategies::Collective>) {
          s << name_of(w.kind) << " " << name_of(w.dtype) << " group " << w.group << " "
            << w.bytes.count();
        } else if constexpr (std::is_same_v<W, strategies::Send>) {
          s << "send " << w.peer << " " << w.bytes.count() << (w.eager ? " eager" : "");
        } else {
          s << "recv " << w.peer << " " << w.bytes.count();
        }
      },
      op.work);
  s << " deps";
  for (auto d : p.deps_of(op)) s << " " << d;
  s << " effects";
  for (const auto& e : p.effects_of(op)) {
    s << " " << e.delta.count() << "/" << name_of(e.category) << "/" << name_of(e.tier) << "/"
      << e.at_end;
  }
  return s.str();
}

inline void check_same_program(const strategies::Program& a, const strategies::Program& b) {
  REQUIRE(a.world_size() == b.world_size());
  REQUIRE(a.groups().size() == b.groups().size());
  for (std::size_t g = 0; g < a.groups().size(); ++g) {
    CHECK(a.groups()[g].ranks == b.groups()[g].ranks);
    CHECK(a.groups()[g].name == b.groups()[g].name);
  }
  REQUIRE(a.op_count() == b.op_count());
  for (int r = 0; r < a.world_size(); ++r) {
    REQUIRE(a.first_op(r) == b.first_op(r));
    CHECK(a.event_driven(r) == b.event_driven(r));
    const auto& ma = a.initial_memory(r);
    const auto& mb = b.initial_memory(r);
    REQUIRE(ma.size() == mb.size());
    for (std::size_t i = 0; i < ma.size(); ++i) {
      CHECK(ma[i].category == mb[i].category);
      CHECK(ma[i].tier == mb[i].tier);
      CHECK(ma[i].bytes == mb[i].bytes);
    }
  }
  std::size_t differing = 0;
  for (strategies::OpId id = 0; id < a.op_count(); ++id) {
    const std::string ta = text_of(a, a.op(id));
    const std::string tb = text_of(b, b.op(id));
    if (ta != tb && ++differing <= 3) CHECK(ta == tb);
  }
  CHECK(differing == 0);
}

}  // namespace stratasim::testing
