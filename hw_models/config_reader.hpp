// Strict reading of JSON configs into typed structs. Every error names the source (a file, or
// the command line for overrides), the JSON path within it and what was expected; unknown keys
// are errors with a "did you mean" suggestion.
//
// A config may name other configs by path ("cluster": "../hardware/clusters/dgx-a100-128.json");
// Document::inline_reference replaces such a string with the file's content, relative to the
// file that names it, and remembers where every subtree came from so that errors point into
// the right file.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/units.hpp"

namespace stratasim::config {

class ConfigError : public std::runtime_error {
 public:
  /// `source`: a file path or "command line"; `path`: dotted JSON path within it ("" = whole
  /// document); `message`: what was expected.
  ConfigError(std::string source, std::string path, std::string message);
  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }
  const std::string& message() const { return message_; }

 private:
  std::string source_, path_, message_;
};

/// Thrown by the validate() of typed configs; `path` is relative to the config's own object
/// and is turned into a ConfigError naming the file by whoever read the config.
class ValidationError : public std::runtime_error {
 public:
  ValidationError(std::string path, const std::string& message)
      : std::runtime_error(message), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Joins a dotted path and a key: join("a.b", "c") == "a.b.c", join("", "c") == "c".
std::string join_path(std::string_view path, std::string_view key);

/// A JSON document assembled from files and command-line overrides.
class Document {
 public:
  /// Reads and parses `file`; a missing file or malformed JSON is a ConfigError.
  static Document load(const std::filesystem::path& file);
  /// A document built in memory (tests, programmatic use); `source` names it in errors.
  static Document from_json(nlohmann::json root, std::string source);

  const nlohmann::json& root() const { return root_; }
  /// The value at a dotted path, or nullptr when a component is missing.
  const nlohmann::json* find(std::string_view path) const;

  /// If the value at `path` is a string, loads the file it names (relative to the directory
  /// of the file that contains `path`) and puts its content there. Objects are left as they are.
  void inline_reference(const std::string& path);

  /// Sets the value at a dotted path, creating missing objects on the way; `origin` names the
  /// override in errors (e.g. "command line (--set training.seq_len=4096)"). A null value
  /// removes the key instead.
  void set(const std::string& path, nlohmann::json value, const std::string& origin);

  /// Throws a ConfigError for `path`, naming the file (or override) the value came from and
  /// the path within it.
  [[noreturn]] void fail(const std::string& path, const std::string& message) const;
  /// fail() for a rule over several values: at the first of `paths` whose value an override
  /// set (the user's latest word, e.g. --megatron-args), else at `otherwise`.
  [[noreturn]] void fail_among(const std::vector<std::string>& paths, const std::string& otherwise,
                               const std::string& message) const;

  /// Runs `check` (a validate() call); a ValidationError becomes a ConfigError at
  /// join_path(base, error.path()).
  template <class Check>
  void validated(const std::string& base, Check&& check) const {
    try {
      check();
    } catch (const ValidationError& e) {
      fail(join_path(base, e.path()), e.what());
    }
  }

  /// The file the value at `path` came from (empty for overrides and in-memory documents).
  std::filesystem::path file_of(const std::string& path) const;

 private:
  struct Origin {
    std::string prefix;          // dotted path of the subtree
    std::string source;          // file name, or a description of the override
    std::filesystem::path file;  // empty when not from a file
  };
  const Origin& origin_of(const std::string& path) const;

  nlohmann::json root_;
  std::vector<Origin> origins_;
};

/// Reads the members of one JSON object, checking types and units. Call finish() after the
/// last member to reject unknown keys.
class ObjectReader {
 public:
  /// Fails unless the value at `path` is an object (`what` names it: "a device").
  ObjectReader(const Document& doc, std::string path, std::string_view what = "an object");

  const std::string& path() const { return path_; }
  const Document& document() const { return *doc_; }
  std::string path_of(std::string_view key) const { return join_path(path_, key); }
  bool has(std::string_view key);

  std::int64_t integer(std::string_view key);
  std::int64_t integer_or(std::string_view key, std::int64_t fallback);
  /// An integer in [lo, hi].
  std::int64_t integer_in(std::string_view key, std::int64_t lo, std::int64_t hi);
  std::int64_t integer_in_or(std::string_view key, std::int64_t lo, std::int64_t hi,
                             std::int64_t fallback);
  double number(std::string_view key);
  double number_or(std::string_view key, double fallback);
  bool boolean(std::string_view key);
  bool boolean_or(std::string_view key, bool fallback);
  std::string string(std::string_view key);
  std::string string_or(std::string_view key, std::string fallback);
  /// A string that must be one of `options`.
  std::string choice(std::string_view key, std::initializer_list<std::string_view> options);
  std::string choice_or(std::string_view key, std::initializer_list<std::string_view> options,
                        std::string fallback);

  Time time(std::string_view key);
  Time time_or(std::string_view key, Time fallback);
  Bytes bytes(std::string_view key);
  Bytes bytes_or(std::string_view key, Bytes fallback);
  Bandwidth bandwidth(std::string_view key);
  FlopRate flop_rate(std::string_view key);

  /// A nested object member.
  ObjectReader object(std::string_view key, std::string_view what = "an object");

  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  /// Rejects members that no accessor asked for, suggesting the closest known key.
  void finish() const;

 private:
  const nlohmann::json& require(std::string_view key);
  const nlohmann::json* optional(std::string_view key);
  template <class T, class Parse>
  T unit_value(std::string_view key, std::string_view example, Parse parse);

  const Document* doc_;
  std::string path_;
  const nlohmann::json* object_;
  std::set<std::string, std::less<>> known_;
};

/// The array at `key` of `r` (a required member), or a failure naming what was `expected`.
const nlohmann::json& array_of(ObjectReader& r, std::string_view key, const std::string& expected);

/// The known key closest to `key` by edit distance, or "" when none is close.
std::string closest_match(std::string_view key, const std::vector<std::string>& known);
/// Levenshtein distance (insertions, deletions, substitutions) between `a` and `b`.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// Parses the text of a `--set key=value` override: JSON when it parses ("4", "true",
/// "{...}"), otherwise the text as a string ("400 Gb/s").
nlohmann::json parse_override_value(std::string_view text);

}  // namespace stratasim::config
