#include "hw_models/config_reader.hpp"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>

#include "hw_models/json_depth.hpp"

namespace stratasim::config {

namespace {

// A value as JSON for messages, cut after 80 characters: an error never prints a whole huge
// value.
std::string shown(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 80) text = text.substr(0, 80) + "...";
  return text;
}

std::string describe(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return "a boolean (" + shown(v) + ")";
    case nlohmann::json::value_t::string:
      return "a string (" + shown(v) + ")";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float:
      return "a number (" + shown(v) + ")";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    default:
      return "an unsupported value";
  }
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> parts;
  while (!path.empty()) {
    auto dot = path.find('.');
    parts.emplace_back(path.substr(0, dot));
    if (dot == std::string_view::npos) break;
    path.remove_prefix(dot + 1);
  }
  return parts;
}

bool has_prefix(std::string_view path, std::string_view prefix) {
  if (prefix.empty()) return true;
  return path.starts_with(prefix) && (path.size() == prefix.size() || path[prefix.size()] == '.');
}

struct TooDeep {};

// nlohmann's own DOM builder (what nlohmann::json::parse uses) behind a nesting check: every
// value and key is checked against the number of containers open around it, where a
// nlohmann::json::parse callback would see it, and TooDeep is thrown past kMaxJsonDepth. The
// parser itself is not recursive. (nlohmann::json::parse with a callback would do the same,
// but its callback parser scans the enclosing array for discarded values each time an object
// ends: quadratic in the elements of an array of objects, minutes for a 400 MB trace.)
class BoundedDom {
 public:
  using json = nlohmann::json;
  BoundedDom(json& root, bool allow_exceptions) : dom_(root, allow_exceptions) {}

  bool null() { return check(), dom_.null(); }
  bool boolean(bool v) { return check(), dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return check(), dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return check(), dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return check(), dom_.number_float(v, s);
  }
  bool string(json::string_t& v) { return check(), dom_.string(v); }
  bool binary(json::binary_t& v) { return check(), dom_.binary(v); }
  bool key(json::string_t& k) { return check(), dom_.key(k); }
  bool start_object(std::size_t n) {
    check();
    ++depth_;
    return dom_.start_object(n);
  }
  bool start_array(std::size_t n) {
    check();
    ++depth_;
    return dom_.start_array(n);
  }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);
  }
  bool errored() const { return dom_.is_errored(); }

 private:
  void check() const {
    if (depth_ > kMaxJsonDepth) throw TooDeep{};
  }
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  int depth_ = 0;  // containers open
};

// nlohmann::json::parse with the nesting bound (throws TooDeep); without exceptions a
// discarded value for text that does not parse, as nlohmann::json::parse gives.
nlohmann::json parse_bounded(std::string_view text, bool allow_exceptions = true) {
  nlohmann::json root;
  BoundedDom dom(root, allow_exceptions);
  const bool parsed = nlohmann::json::sax_parse(text.begin(), text.end(), &dom);
  if (!parsed || dom.errored()) return nlohmann::json(nlohmann::json::value_t::discarded);
  return root;
}

const std::string kTooDeepMessage =
    "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";

nlohmann::json parse_file(const std::filesystem::path& file, const std::string& source) {
  // Only regular files: a directory is not "malformed JSON", a FIFO would block forever and
  // /dev/zero would be read until memory runs out.
  std::error_code status_error;
  const auto status = std::filesystem::status(file, status_error);
  if (std::filesystem::is_directory(status)) {
    throw ConfigError(source, "", "is a directory; expected a JSON file");
  }
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw ConfigError(source, "", "is not a regular file (a pipe or device); expected a JSON file");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    bool exists = std::filesystem::exists(file, ec);
    throw ConfigError(source, "", exists ? "cannot be read" : "no such file");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  try {
    return parse_bounded(text);
  } catch (const TooDeep&) {
    throw ConfigError(source, "", kTooDeepMessage);
  } catch (const nlohmann::json::parse_error& e) {
    // Turn the byte offset into a line and column a person can go to.
    std::size_t offset = std::min<std::size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    std::size_t line =
        1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
    std::size_t line_start = text.rfind('\n', offset == 0 ? 0 : offset - 1);
    std::size_t column = line_start == std::string::npos ? offset + 1 : offset - line_start;
    std::string what = e.what();
    auto detail = what.find("syntax error");
    throw ConfigError(source, "",
                      "malformed JSON at line " + std::to_string(line) + ", column " +
                          std::to_string(column) + ": " +
                          (detail == std::string::npos ? what : what.substr(detail)));
  } catch (const nlohmann::json::exception& e) {
    // Valid syntax the library cannot hold, e.g. a number like 1e400 (out_of_range).
    throw ConfigError(source, "", std::string("unreadable JSON: ") + e.what());
  }
}

}  // namespace

nlohmann::json parse_json_depth_bounded(std::string_view text, const std::string& source) {
  try {
    return parse_bounded(text);
  } catch (const TooDeep&) {
    throw ConfigError(source, "", kTooDeepMessage);
  }
}

const std::string& json_too_deep_message() {
  return kTooDeepMessage;
}

ConfigError::ConfigError(std::string source, std::string path, std::string message)
    : std::runtime_error(source + (path.empty() ? "" : ": at " + path) + ": " + message),
      source_(std::move(source)),
      path_(std::move(path)),
      message_(std::move(message)) {}

std::string join_path(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  std::string out(path);
  out += '.';
  out += key;
  return out;
}

Document Document::load(const std::filesystem::path& file) {
  Document doc;
  doc.root_ = parse_file(file, file.string());
  doc.origins_.push_back({"", file.string(), file});
  return doc;
}

Document Document::from_json(nlohmann::json root, std::string source) {
  Document doc;
  doc.root_ = std::move(root);
  doc.origins_.push_back({"", std::move(source), {}});
  return doc;
}

const nlohmann::json* Document::find(std::string_view path) const {
  const nlohmann::json* node = &root_;
  for (const auto& part : split_path(path)) {
    if (node->is_array()) {  // "overrides.0": a numeric part indexes an array
      if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos ||
          part.size() > 9) {
        return nullptr;
      }
      const auto index = static_cast<std::size_t>(std::stoul(std::string(part)));
      if (index >= node->size()) return nullptr;
      node = &(*node)[index];
      continue;
    }
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

const Document::Origin& Document::origin_of(const std::string& path) const {
  // Later origins were inlined into earlier ones, so the last matching prefix is the deepest.
  const Origin* best = &origins_.front();
  for (const auto& o : origins_) {
    if (has_prefix(path, o.prefix) && o.prefix.size() >= best->prefix.size()) best = &o;
  }
  return *best;
}

std::filesystem::path Document::file_of(const std::string& path) const {
  return origin_of(path).file;
}

void Document::fail(const std::string& path, const std::string& message) const {
  const Origin& o = origin_of(path);
  if (o.file.empty() && !o.prefix.empty()) {
    throw ConfigError(o.source, path, message);  // an override: its own path is the full one
  }
  std::string relative = path.substr(std::min(path.size(), o.prefix.size()));
  if (!relative.empty() && relative.front() == '.') relative.erase(0, 1);
  throw ConfigError(o.source, relative, message);
}

void Document::fail_among(const std::vector<std::string>& paths, const std::string& otherwise,
                          const std::string& message) const {
  for (const std::string& path : paths) {
    const Origin& o = origin_of(path);
    if (o.file.empty() && !o.prefix.empty() && find(path) != nullptr) fail(path, message);
  }
  fail(otherwise, message);
}

void Document::inline_reference(const std::string& path) {
  const nlohmann::json* value = find(path);
  if (value == nullptr || !value->is_string()) return;
  std::filesystem::path base = file_of(path);
  std::filesystem::path target = value->get<std::string>();
  if (target.is_relative() && !base.empty()) target = base.parent_path() / target;
  target = target.lexically_normal();
  nlohmann::json content;
  try {
    content = parse_file(target, target.string());
  } catch (const ConfigError& e) {
    if (e.message() == "no such file" || e.message() == "cannot be read") {
      fail(path, "names the file " + target.string() + ", which " +
                     (e.message() == "no such file" ? "does not exist" : "cannot be read"));
    }
    throw;
  }
  // `value` points into root_, which this (non-const) member may change.
  auto* node = const_cast<nlohmann::json*>(value);
  *node = std::move(content);
  // Overrides of this subtree recorded earlier are superseded by the file.
  std::erase_if(origins_,
                [&](const Origin& o) { return !o.prefix.empty() && has_prefix(o.prefix, path); });
  origins_.push_back({path, target.string(), target});
}

void Document::set(const std::string& path, nlohmann::json value, const std::string& origin) {
  nlohmann::json* node = &root_;
  std::string walked;
  auto parts = split_path(path);
  if (value.is_null()) {  // null removes the key, so that its default (or derivation) applies
    parts.pop_back();
    for (const auto& part : parts) {
      if (!node->is_object() || !node->contains(part)) return;
      node = &(*node)[part];
    }
    if (node->is_object()) node->erase(path.substr(path.rfind('.') + 1));
    return;
  }
  for (const auto& part : parts) {
    if (node->is_null()) *node = nlohmann::json::object();  // an absent section is created
    if (!node->is_object()) {
      throw ConfigError(
          origin, "",
          "cannot set '" + path + "': '" + walked + "' is " + describe(*node) + ", not an object");
    }
    walked = join_path(walked, part);
    node = &(*node)[part];
  }
  *node = std::move(value);
  origins_.push_back({path, origin, {}});
}

ObjectReader::ObjectReader(const Document& doc, std::string path, std::string_view what)
    : doc_(&doc), path_(std::move(path)), object_(doc.find(path_)) {
  if (object_ == nullptr) doc.fail(path_, "missing; expected " + std::string(what));
  if (!object_->is_object()) {
    doc.fail(path_,
             "expected " + std::string(what) + " (a JSON object), got " + describe(*object_));
  }
}

bool ObjectReader::has(std::string_view key) {
  known_.emplace(key);
  return object_->contains(key);
}

const nlohmann::json* ObjectReader::optional(std::string_view key) {
  known_.emplace(key);
  auto it = object_->find(key);
  // null stands for "not set": the default (or a derived value) applies.
  return it == object_->end() || it->is_null() ? nullptr : &*it;
}

const nlohmann::json& ObjectReader::require(std::string_view key) {
  const nlohmann::json* v = optional(key);
  if (v == nullptr) fail(key, "missing required key '" + std::string(key) + "'");
  return *v;
}

void ObjectReader::fail(std::string_view key, const std::string& message) const {
  doc_->fail(path_of(key), message);
}

namespace {

// nlohmann::json keeps integers in [2^63, 2^64) as number_unsigned, and get<std::int64_t> wraps
// them to negative numbers the user never wrote ("tp": 18446744073709551608 -> -8). Such a value
// is out of every range here; messages show it as written (dump()).
bool above_int64(const nlohmann::json& v) {
  return v.is_number_unsigned() &&
         v.get<std::uint64_t>() >
             static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
}

}  // namespace

std::int64_t ObjectReader::integer(std::string_view key) {
  const auto& v = require(key);
  if (above_int64(v)) fail(key, "expected an integer below 2^63, got " + v.dump());
  if (v.is_number_integer()) return v.get<std::int64_t>();
  fail(key, "expected an integer, got " + describe(v));
}

std::int64_t ObjectReader::integer_or(std::string_view key, std::int64_t fallback) {
  return optional(key) ? integer(key) : fallback;
}

std::int64_t ObjectReader::integer_in(std::string_view key, std::int64_t lo, std::int64_t hi) {
  const auto out_of_range = [&](const std::string& written) {
    fail(key, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                  ", got " + written);
  };
  if (above_int64(require(key))) out_of_range(require(key).dump());
  std::int64_t v = integer(key);
  if (v < lo || v > hi) out_of_range(std::to_string(v));
  return v;
}

std::int64_t ObjectReader::integer_in_or(std::string_view key, std::int64_t lo, std::int64_t hi,
                                         std::int64_t fallback) {
  return optional(key) ? integer_in(key, lo, hi) : fallback;
}

double ObjectReader::number(std::string_view key) {
  const auto& v = require(key);
  if (!v.is_number()) fail(key, "expected a number, got " + describe(v));
  return v.get<double>();
}

double ObjectReader::number_or(std::string_view key, double fallback) {
  return optional(key) ? number(key) : fallback;
}

bool ObjectReader::boolean(std::string_view key) {
  const auto& v = require(key);
  if (!v.is_boolean()) fail(key, "expected true or false, got " + describe(v));
  return v.get<bool>();
}

bool ObjectReader::boolean_or(std::string_view key, bool fallback) {
  return optional(key) ? boolean(key) : fallback;
}

std::string ObjectReader::string(std::string_view key) {
  const auto& v = require(key);
  if (!v.is_string()) fail(key, "expected a string, got " + describe(v));
  return v.get<std::string>();
}

std::string ObjectReader::string_or(std::string_view key, std::string fallback) {
  return optional(key) ? string(key) : std::move(fallback);
}

std::string ObjectReader::choice(std::string_view key,
                                 std::initializer_list<std::string_view> options) {
  std::string value = string(key);
  for (auto o : options) {
    if (o == value) return value;
  }
  std::string list;
  for (auto o : options) list += (list.empty() ? "\"" : ", \"") + std::string(o) + "\"";
  std::vector<std::string> known(options.begin(), options.end());
  std::string hint = closest_match(value, known);
  fail(key, "expected one of " + list + ", got \"" + value + "\"" +
                (hint.empty() ? "" : "; did you mean \"" + hint + "\"?"));
}

std::string ObjectReader::choice_or(std::string_view key,
                                    std::initializer_list<std::string_view> options,
                                    std::string fallback) {
  return optional(key) ? choice(key, options) : std::move(fallback);
}

template <class T, class Parse>
T ObjectReader::unit_value(std::string_view key, std::string_view example, Parse parse) {
  const auto& v = require(key);
  if (!v.is_string()) {
    fail(key, "expected a quantity with its unit as a string, such as \"" + std::string(example) +
                  "\", got " + describe(v));
  }
  try {
    return parse(v.get<std::string>());
  } catch (const UnitError& e) {
    fail(key, e.what());
  }
}

Time ObjectReader::time(std::string_view key) {
  return unit_value<Time>(key, "2 us", parse_time);
}
Time ObjectReader::time_or(std::string_view key, Time fallback) {
  return optional(key) ? time(key) : fallback;
}
Bytes ObjectReader::bytes(std::string_view key) {
  return unit_value<Bytes>(key, "80 GiB", parse_bytes);
}
Bytes ObjectReader::bytes_or(std::string_view key, Bytes fallback) {
  return optional(key) ? bytes(key) : fallback;
}
Bandwidth ObjectReader::bandwidth(std::string_view key) {
  return unit_value<Bandwidth>(key, "900 GB/s", parse_bandwidth);
}
FlopRate ObjectReader::flop_rate(std::string_view key) {
  return unit_value<FlopRate>(key, "312 TFLOP/s", parse_flop_rate);
}

ObjectReader ObjectReader::object(std::string_view key, std::string_view what) {
  require(key);
  return ObjectReader(*doc_, path_of(key), what);
}

void ObjectReader::finish() const {
  std::vector<std::string> known(known_.begin(), known_.end());
  for (const auto& [key, value] : object_->items()) {
    if (known_.contains(key)) continue;
    std::string hint = closest_match(key, known);
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    doc_->fail(path_of(key), "unknown key '" + key + "'" +
                                 (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                                 " (known keys: " + list + ")");
  }
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

const nlohmann::json& array_of(ObjectReader& r, std::string_view key, const std::string& expected) {
  r.has(key);
  const auto* value = r.document().find(r.path_of(key));
  if (value == nullptr || value->is_null()) {
    r.fail(key, "missing required key '" + std::string(key) + "'");
  }
  if (!value->is_array()) r.fail(key, "expected " + expected);
  return *value;
}

std::string closest_match(std::string_view key, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, key.size() / 3) + 1;
  for (const auto& k : known) {
    std::size_t d = edit_distance(key, k);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  return best;
}

nlohmann::json parse_override_value(std::string_view text) {
  nlohmann::json parsed;
  try {
    parsed = parse_bounded(text, /*allow_exceptions=*/false);
  } catch (const TooDeep&) {
    throw ConfigError("command line", "", "--set value: " + kTooDeepMessage);
  }
  if (parsed.is_discarded()) return nlohmann::json(std::string(text));
  return parsed;
}

}  // namespace stratasim::config
