#include "strategies/fsdp.hpp"

#include <string>

namespace stratasim::strategies {

std::string_view name_of(FsdpSharding s) {
  switch (s) {
    case FsdpSharding::full_shard:
      return "FULL_SHARD";
    case FsdpSharding::shard_grad_op:
      return "SHARD_GRAD_OP";
    case FsdpSharding::hybrid_shard:
      return "HYBRID_SHARD";
    case FsdpSharding::no_shard:
      return "NO_SHARD";
  }
  return "?";
}

std::string_view name_of(FsdpBackwardPrefetch p) {
  switch (p) {
    case FsdpBackwardPrefetch::backward_pre:
      return "BACKWARD_PRE";
    case FsdpBackwardPrefetch::backward_post:
      return "BACKWARD_POST";
    case FsdpBackwardPrefetch::none:
      return "NONE";
  }
  return "?";
}

std::string_view name_of(FsdpWrap w) {
  return w == FsdpWrap::block ? "block" : "model";
}

std::optional<FsdpPrecision> fsdp_precision_mode(std::string_view mode, DType t) {
  if (mode == "PURE") return FsdpPrecision{t, t, t};
  if (mode == "DEFAULT") return FsdpPrecision{t, DType::fp32, t};
  if (mode == "FULL") return FsdpPrecision{DType::fp32, DType::fp32, DType::fp32};
  return std::nullopt;
}

FsdpSpec fsdp_defaults(DType t) {
  FsdpSpec s;
  s.precision = *fsdp_precision_mode("DEFAULT", t);
  return s;
}

namespace {

FsdpPrecision read_precision(config::ObjectReader& r, DType t) {
  const nlohmann::json* v = r.document().find(r.path_of("mixed_precision"));
  if (v != nullptr && v->is_object()) {
    config::ObjectReader m = r.object("mixed_precision", "FSDP's mixed precision dtypes");
    auto dtype = [&](const char* key) {
      return *dtype_from_name(m.choice_or(key, {"bf16", "fp16", "fp32"}, std::string(name_of(t))));
    };
    FsdpPrecision p{dtype("param_dtype"), dtype("reduce_dtype"), dtype("buffer_dtype")};
    m.finish();
    return p;
  }
  return *fsdp_precision_mode(
      r.choice_or("mixed_precision", {"DEFAULT", "PURE", "FULL"}, "DEFAULT"), t);
}

}  // namespace

FsdpSpec read_fsdp(config::ObjectReader r, DType t) {
  FsdpSpec s = fsdp_defaults(t);
  const std::string sharding =
      r.choice_or("sharding_strategy", {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"},
                  "FULL_SHARD");
  for (FsdpSharding k : {FsdpSharding::full_shard, FsdpSharding::shard_grad_op,
                         FsdpSharding::hybrid_shard, FsdpSharding::no_shard}) {
    if (name_of(k) == sharding) s.sharding = k;
  }
  s.wrap = r.choice_or("wrap", {"block", "model"}, "block") == "block" ? FsdpWrap::block
                                                                       : FsdpWrap::model;
  const std::string prefetch =
      r.choice_or("backward_prefetch", {"BACKWARD_PRE", "BACKWARD_POST", "NONE"}, "BACKWARD_PRE");
  for (FsdpBackwardPrefetch k : {FsdpBackwardPrefetch::backward_pre,
                                 FsdpBackwardPrefetch::backward_post, FsdpBackwardPrefetch::none}) {
    if (name_of(k) == prefetch) s.backward_prefetch = k;
  }
  s.forward_prefetch = r.boolean_or("forward_prefetch", false);
  s.limit_all_gathers = r.boolean_or("limit_all_gathers", true);
  s.precision = read_precision(r, t);
  s.unit_host_time = r.time_or("unit_host_time", kDefaultFsdpUnitHostTime);
  if (s.unit_host_time > Time::ms(1000)) {
    r.fail("unit_host_time", "expected at most 1 s of host time per FSDP unit and pass");
  }
  r.finish();
  return s;
}

}  // namespace stratasim::strategies
