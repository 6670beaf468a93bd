// Writing files so that a reader never sees half of one: write to a temporary file beside the
// target, then rename it onto the target.
//
// Contract (one rule for every file the project writes: profiles, Chakra traces, the three
// simulation outputs, CSVs of the commands):
// - The temporary of `file` is a sibling in the same folder, named ".<name>.tmp-<pid>-<n>"
//   (process id and a per-process counter, so concurrent writers and threads never share one);
//   being in the same folder, the rename is atomic on POSIX file systems: a reader sees the old
//   file or the complete new one.
// - The folder of `file` must exist (callers create it); nothing else is created.
// - On any failure (the temporary cannot be created, a write or the close fails, the body
//   throws, the rename fails) the temporaries are removed, the targets keep their old content,
//   and a WriteError is thrown whose message names the target path ("cannot write <path>: ...")
//   — or the body's own exception is rethrown unchanged.
// - StagedWrites is the same rule for several files that belong together (the rank files of a
//   trace): all are written first, and only when all are complete are they renamed, in the order
//   staged; the destructor removes every temporary not committed.
#pragma once

#include <filesystem>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace stratasim::files {

/// A file could not be written; the message names the path.
struct WriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The sibling temporary file used for `file` (a fresh name at every call).
std::filesystem::path temporary_sibling(const std::filesystem::path& file);

/// Files written to temporaries now and renamed onto their targets by commit().
class StagedWrites {
 public:
  StagedWrites() = default;
  ~StagedWrites();
  StagedWrites(const StagedWrites&) = delete;
  StagedWrites& operator=(const StagedWrites&) = delete;

  /// Writes what `body` writes to the temporary of `file` (binary, truncated).
  void stage(const std::filesystem::path& file, const std::function<void(std::ostream&)>& body);
  /// Writes `bytes` to the temporary of `file`.
  void stage(const std::filesystem::path& file, std::string_view bytes);
  /// Renames every staged temporary onto its file, in the order staged.
  void commit();
  /// The target files staged so far, in order.
  std::vector<std::filesystem::path> targets() const;

 private:
  void discard() noexcept;
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> staged_;  // {temp, file}
};

/// Writes `file` atomically with what `body` writes.
void write_atomically(const std::filesystem::path& file,
                      const std::function<void(std::ostream&)>& body);
/// Writes `file` atomically with `text`.
void write_atomically(const std::filesystem::path& file, std::string_view text);

}  // namespace stratasim::files
