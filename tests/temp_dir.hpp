// One temporary folder per test case, for every test that writes files.
//
// Contract: a TempDir is a fresh, empty folder made by mkdtemp(3) under the system's temporary
// folder (std::filesystem::temp_directory_path(), i.e. $TMPDIR or /tmp), named
// "stratasim-<tag>-XXXXXX" with six random characters, so that no two test cases (of one
// executable or of several run at once by `ctest -j`) ever share a path. The folder and
// everything in it are removed when the TempDir goes out of scope (errors while removing are
// ignored: a leftover folder must not fail a test). Make one at the top of each TEST_CASE that
// writes files, and build every path from it; never write to a fixed path.
#pragma once

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <stdlib.h>  // mkdtemp (POSIX)

namespace stratasim::testing {

class TempDir {
 public:
  /// Makes the folder; `tag` (letters, digits, '-') says which tests made it.
  explicit TempDir(std::string_view tag = "test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("stratasim-" + std::string(tag) + "-XXXXXX"))
            .string();
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr)
      throw std::runtime_error("cannot make a temporary folder " + pattern + ": " +
                               std::strerror(errno));
    path_ = buffer.data();
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// The path of `name` inside the folder (not created).
  std::filesystem::path operator/(const std::filesystem::path& name) const { return path_ / name; }
  /// Writes `text` to `name` inside the folder (making the folders of `name`) and returns its
  /// path.
  std::filesystem::path write(const std::filesystem::path& name, std::string_view text) const {
    const auto file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::binary);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + file.string());
    return file;
  }
  /// A new, empty sub-folder `name` of the folder, returned.
  std::filesystem::path subdir(const std::filesystem::path& name) const {
    const auto dir = path_ / name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace stratasim::testing
