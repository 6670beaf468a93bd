#include "strategies/transport.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace stratasim::strategies {

namespace {

constexpr std::string_view kPolicyNames[] = {"none", "layer", "rules", "fifo"};
constexpr std::string_view kSchedulingNames[] = {"strict", "weighted"};
constexpr std::string_view kOrderNames[] = {"fair", "fifo"};

/// "dp_comm" and "dp-comm" alike: the report's names use hyphens.
std::string hyphenated(std::string text) {
  std::replace(text.begin(), text.end(), '_', '-');
  return text;
}

template <class Enum, int Count>
std::vector<std::string> names_of() {
  std::vector<std::string> names;
  for (int i = 0; i < Count; ++i) names.emplace_back(name_of(static_cast<Enum>(i)));
  return names;
}

/// The enum value named `key` in `r` (a stream or a phase), failing with the names it takes.
template <class Enum, int Count>
Enum read_name(config::ObjectReader& r, std::string_view key, std::string_view what) {
  const std::string given = hyphenated(r.string(key));
  const auto names = names_of<Enum, Count>();
  for (int i = 0; i < Count; ++i) {
    if (names[static_cast<std::size_t>(i)] == given) return static_cast<Enum>(i);
  }
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "\"" : ", \"") + n + "\"";
  const std::string hint = config::closest_match(given, names);
  r.fail(key, "expected " + std::string(what) + ": one of " + list +
                  (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)") + ", got \"" + given +
                  "\"");
}

PriorityRule read_rule(const config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a priority rule {stream, phase, layers, class}");
  PriorityRule rule;
  if (r.has("stream")) rule.stream = read_name<Stream, kStreamCount>(r, "stream", "a stream");
  if (r.has("phase")) rule.phase = read_name<Phase, kPhaseCount>(r, "phase", "a phase");
  if (r.has("layers")) {
    const std::string expected = "[first, last]: two layer indices, first <= last, such as [0, 3]";
    const auto& v = config::array_of(r, "layers", expected);
    if (v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
        v[0].get<std::int64_t>() < 0 || v[1].get<std::int64_t>() < v[0].get<std::int64_t>() ||
        v[1].get<std::int64_t>() > 32767) {
      r.fail("layers", "expected " + expected);
    }
    rule.layers = {static_cast<int>(v[0].get<std::int64_t>()),
                   static_cast<int>(v[1].get<std::int64_t>())};
  }
  rule.klass = static_cast<int>(r.integer_in("class", 0, TransportPolicy::kMaxClasses - 1));
  r.finish();
  return rule;
}

}  // namespace

std::string_view name_of(PriorityPolicy p) {
  return kPolicyNames[static_cast<int>(p)];
}
std::string_view name_of(LinkScheduling s) {
  return kSchedulingNames[static_cast<int>(s)];
}
std::string_view name_of(ClassOrder o) {
  return kOrderNames[static_cast<int>(o)];
}

bool PriorityRule::matches(const Op& op) const {
  if (stream && op.stream != *stream) return false;
  if (phase && op.phase != *phase) return false;
  if (layers) {
    if (op.layer_begin < 0) return false;
    if (op.layer_begin < layers->first || op.layer_begin > layers->second) return false;
  }
  return true;
}

int TransportPolicy::class_of(const Op& op, int layers) const {
  if (!classed() || priority == PriorityPolicy::fifo) return 0;
  if (priority == PriorityPolicy::rules) {
    for (const auto& rule : rules) {
      if (rule.matches(op)) return rule.klass;
    }
    return classes - 1;
  }
  if (op.layer_begin < 0 || layers <= 0) return classes - 1;
  const std::int64_t c = static_cast<std::int64_t>(op.layer_begin) * classes / layers;
  return static_cast<int>(std::clamp<std::int64_t>(c, 0, classes - 1));
}

std::int64_t TransportPolicy::level(const Op& op, int layers, std::int64_t start_order) const {
  if (priority == PriorityPolicy::fifo) return start_order;
  const std::int64_t c = class_of(op, layers);
  if (within_class == ClassOrder::fifo && priority != PriorityPolicy::none) {
    return c * kMaxStarts + start_order;
  }
  return c;
}

bool is_gradient_message(const Op& op) {
  if (op.stream != Stream::dp_comm) return false;
  if (const auto* c = std::get_if<Collective>(&op.work)) {
    return c->kind == CollectiveKind::all_reduce || c->kind == CollectiveKind::reduce_scatter ||
           c->kind == CollectiveKind::reduce;
  }
  // A parameter server's pull is sent in the optimizer phase (after the server's update) and
  // carries parameters, not gradients.
  return std::holds_alternative<Send>(op.work) && op.phase != Phase::forward &&
         op.phase != Phase::optimizer;
}

double TransportPolicy::droppable(const Op& op) const {
  return loss_bound > 0 && is_gradient_message(op) ? loss_bound : 0.0;
}

void TransportPolicy::validate() const {
  if (classes < 1 || classes > kMaxClasses) {
    throw config::ValidationError("classes", "expected 1 to " + std::to_string(kMaxClasses) +
                                                 " classes, got " + std::to_string(classes));
  }
  if (!(loss_bound >= 0 && loss_bound < 1)) {
    throw config::ValidationError(
        "loss_bound",
        "expected the fraction of a gradient message that may be dropped, in "
        "[0, 1), got " +
            std::to_string(loss_bound));
  }
  if (scheduling == LinkScheduling::weighted &&
      weights.size() != static_cast<std::size_t>(classes)) {
    throw config::ValidationError("weights", "weighted scheduling needs one weight per class (" +
                                                 std::to_string(classes) + "), got " +
                                                 std::to_string(weights.size()));
  }
  if (scheduling == LinkScheduling::strict && !weights.empty()) {
    throw config::ValidationError("weights", "apply to \"weighted\" scheduling only");
  }
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] >= 1e-3 && weights[i] <= 1e6)) {
      throw config::ValidationError("weights." + std::to_string(i),
                                    "expected a weight from 0.001 to 1e6");
    }
  }
  if (priority == PriorityPolicy::fifo && scheduling != LinkScheduling::strict) {
    throw config::ValidationError(
        "scheduling", "priority \"fifo\" serves messages in start order: \"strict\" only");
  }
  if (within_class == ClassOrder::fifo &&
      (priority == PriorityPolicy::none || priority == PriorityPolicy::fifo)) {
    throw config::ValidationError("within_class",
                                  "orders the transfers of one class: it applies with priority "
                                  "\"layer\" or \"rules\"");
  }
  if (within_class == ClassOrder::fifo && scheduling != LinkScheduling::strict) {
    throw config::ValidationError(
        "within_class",
        "\"fifo\" within a class gives every transfer its own strict level: "
        "scheduling \"strict\" only");
  }
  if (priority != PriorityPolicy::rules && !rules.empty()) {
    throw config::ValidationError("rules", "apply to priority \"rules\" only");
  }
  if (priority == PriorityPolicy::rules && rules.empty()) {
    throw config::ValidationError("rules", "priority \"rules\" needs at least one rule");
  }
  for (std::size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].klass >= classes) {
      throw config::ValidationError("rules." + std::to_string(i) + ".class",
                                    "expected a class below classes (" + std::to_string(classes) +
                                        "), got " + std::to_string(rules[i].klass));
    }
  }
}

TransportPolicy read_transport(config::ObjectReader r) {
  TransportPolicy t;
  const std::string policy = r.choice_or("priority", {"none", "layer", "rules", "fifo"}, "none");
  t.priority = policy == "layer"   ? PriorityPolicy::layer
               : policy == "rules" ? PriorityPolicy::rules
               : policy == "fifo"  ? PriorityPolicy::fifo
                                   : PriorityPolicy::none;
  t.scheduling = r.choice_or("scheduling", {"strict", "weighted"}, "strict") == "weighted"
                     ? LinkScheduling::weighted
                     : LinkScheduling::strict;
  t.within_class = r.choice_or("within_class", {"fair", "fifo"}, "fair") == "fifo"
                       ? ClassOrder::fifo
                       : ClassOrder::fair;
  t.classes = static_cast<int>(r.integer_in_or("classes", 1, TransportPolicy::kMaxClasses, 8));
  if (r.has("weights")) {
    const auto& v =
        config::array_of(r, "weights", "an array of weights, one per class, such as [3, 1]");
    for (const auto& w : v) {
      if (!w.is_number()) r.fail("weights", "expected numbers, such as [3, 1]");
      t.weights.push_back(w.get<double>());
    }
  }
  if (r.has("rules")) {
    const auto& v =
        config::array_of(r, "rules", "an array of rules {stream, phase, layers, class}");
    for (std::size_t i = 0; i < v.size(); ++i) {
      t.rules.push_back(
          read_rule(r.document(), config::join_path(r.path_of("rules"), std::to_string(i))));
    }
  }
  t.loss_bound = r.number_or("loss_bound", 0.0);
  r.finish();
  return t;
}

}  // namespace stratasim::strategies
