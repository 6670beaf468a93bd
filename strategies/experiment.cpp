#include "strategies/experiment.hpp"

namespace stratasim::strategies {

std::string_view name_of(ScheduleKind s) {
  switch (s) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
  }
  return "?";
}

namespace {

ParallelismSpec read_parallelism(config::ObjectReader r) {
  ParallelismSpec p;
  constexpr std::int64_t kMaxDegree = 1 << 24;
  p.tp = static_cast<int>(r.integer_in_or("tp", 1, kMaxDegree, 1));
  p.pp = static_cast<int>(r.integer_in_or("pp", 1, kMaxDegree, 1));
  p.dp = static_cast<int>(r.integer_in_or("dp", 1, kMaxDegree, 0));
  p.sequence_parallel = r.boolean_or("sequence_parallel", false);
  p.schedule = r.choice_or("schedule", {"1f1b", "gpipe"}, "1f1b") == "gpipe"
                   ? ScheduleKind::gpipe
                   : ScheduleKind::one_f_one_b;
  p.micro_batch = static_cast<int>(r.integer_in_or("micro_batch", 1, kMaxDegree, 1));
  p.dp_bucket_size = r.bytes_or("dp_bucket_size", p.dp_bucket_size);
  if (p.dp_bucket_size.count() <= 0) r.fail("dp_bucket_size", "expected a positive size");
  p.dp_overlap = r.boolean_or("dp_overlap", true);
  r.finish();
  return p;
}

TrainingSpec read_training(config::ObjectReader r) {
  TrainingSpec t;
  t.global_batch = r.integer_in("global_batch", 1, std::int64_t{1} << 40);
  t.seq_len = static_cast<int>(r.integer_in("seq_len", 1, 1 << 24));
  t.dtype = *dtype_from_name(r.choice_or("dtype", {"bf16", "fp16", "fp32"}, "bf16"));
  r.choice_or("optimizer", {"adam"}, "adam");
  t.flash_attention = r.boolean_or("flash_attention", false);
  r.finish();
  return t;
}

std::string number(std::int64_t v) {
  return std::to_string(v);
}

}  // namespace

Experiment read_experiment(config::Document& doc, const std::vector<Override>& overrides) {
  // Inline referenced files first so that overrides can reach into them.
  doc.inline_reference("model");
  doc.inline_reference("cluster");
  doc.inline_reference("cluster.device");
  for (const auto& o : overrides) {
    doc.set(o.path, o.value, o.origin);
    // An override may itself name a file ("--set cluster=other.json").
    if (o.path == "model" || o.path == "cluster") doc.inline_reference(o.path);
    if (o.path == "cluster" || o.path == "cluster.device") doc.inline_reference("cluster.device");
  }

  config::ObjectReader r(doc, "", "an experiment");
  Experiment e;
  e.name = r.string("name");
  e.description = r.string_or("description", "");
  e.file = doc.file_of("");
  r.has("model");
  e.model = read_model(doc, "model");
  r.has("cluster");
  e.cluster = hw::read_cluster(doc, "cluster");
  e.parallelism = read_parallelism(r.object("parallelism", "the parallel strategy"));
  e.training = read_training(r.object("training", "the training settings"));
  r.finish();

  // Cross-checks, each reported at the key a user would change.
  auto& p = e.parallelism;
  const auto& m = e.model;
  if (m.heads % p.tp != 0 || m.kv_heads % p.tp != 0) {
    doc.fail("parallelism.tp", "must divide the model's attention heads (heads " + number(m.heads) +
                                   ", kv_heads " + number(m.kv_heads) + "), got " + number(p.tp));
  }
  if (m.ffn_hidden % p.tp != 0) {
    doc.fail("parallelism.tp", "must divide the model's ffn_hidden (" + number(m.ffn_hidden) +
                                   "), got " + number(p.tp));
  }
  if (p.pp > m.layers) {
    doc.fail("parallelism.pp",
             "must not exceed the model's layers (" + number(m.layers) + "), got " + number(p.pp));
  }
  const std::int64_t world = e.cluster.world_size();
  const std::int64_t model_parallel = std::int64_t{p.tp} * p.pp;
  if (p.dp == 0) {
    if (world % model_parallel != 0) {
      doc.fail("parallelism", "tp * pp = " + number(model_parallel) + " does not divide the " +
                                  number(world) + " devices of cluster " + e.cluster.name +
                                  "; set tp, pp (and dp) so that tp * pp * dp = " + number(world));
    }
    p.dp = static_cast<int>(world / model_parallel);
  } else if (model_parallel * p.dp != world) {
    doc.fail("parallelism.dp", "tp * pp * dp = " + number(p.tp) + " * " + number(p.pp) + " * " +
                                   number(p.dp) + " = " + number(model_parallel * p.dp) +
                                   ", but cluster " + e.cluster.name + " has " + number(world) +
                                   " devices");
  }
  const std::int64_t per_step = std::int64_t{p.dp} * p.micro_batch;
  if (e.training.global_batch % per_step != 0) {
    doc.fail("training.global_batch", "must be divisible by dp * micro_batch = " + number(p.dp) +
                                          " * " + number(p.micro_batch) + " = " + number(per_step) +
                                          ", got " + number(e.training.global_batch));
  }
  if (m.position_embedding == PositionEmbedding::learned && e.training.seq_len > m.max_seq_len) {
    doc.fail("training.seq_len", "must not exceed the model's max_seq_len (" +
                                     number(m.max_seq_len) + "), got " +
                                     number(e.training.seq_len));
  }
  if (p.sequence_parallel && e.training.seq_len % p.tp != 0) {
    doc.fail("training.seq_len", "must be divisible by tp (" + number(p.tp) +
                                     ") with sequence parallelism, got " +
                                     number(e.training.seq_len));
  }
  if (e.microbatches() > (1 << 24)) {
    doc.fail("training.global_batch", "gives more than 16,777,216 microbatches per pipeline");
  }
  return e;
}

Experiment load_experiment(const std::filesystem::path& file,
                           const std::vector<Override>& overrides) {
  auto doc = config::Document::load(file);
  return read_experiment(doc, overrides);
}

}  // namespace stratasim::strategies
