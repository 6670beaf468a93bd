#include "hw_models/files.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <system_error>

#include <unistd.h>

namespace stratasim::files {

namespace fs = std::filesystem;

fs::path temporary_sibling(const fs::path& file) {
  static std::atomic<unsigned long> counter{0};
  std::string name = ".";
  name += file.filename().string();
  name += ".tmp-";
  name += std::to_string(::getpid());
  name += '-';
  name += std::to_string(counter.fetch_add(1));
  return file.parent_path() / name;
}

StagedWrites::~StagedWrites() {
  discard();
}

void StagedWrites::discard() noexcept {
  std::error_code ignored;
  for (const auto& [temp, file] : staged_) fs::remove(temp, ignored);
  staged_.clear();
}

void StagedWrites::stage(const fs::path& file, const std::function<void(std::ostream&)>& body) {
  const fs::path temp = temporary_sibling(file);
  std::ofstream out(temp, std::ios::binary | std::ios::trunc);
  if (!out) {
    throw WriteError("cannot write " + file.string() + ": cannot create " + temp.string() + ": " +
                     std::strerror(errno));
  }
  staged_.emplace_back(temp, file);  // from here on removed on failure
  body(out);
  out.flush();
  out.close();
  if (out.fail()) throw WriteError("cannot write " + file.string() + ": write failed");
}

void StagedWrites::stage(const fs::path& file, std::string_view bytes) {
  stage(file, [&](std::ostream& out) {
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  });
}

void StagedWrites::commit() {
  for (std::size_t i = 0; i < staged_.size(); ++i) {
    std::error_code ec;
    fs::rename(staged_[i].first, staged_[i].second, ec);
    if (ec) {
      const fs::path file = staged_[i].second;
      staged_.erase(staged_.begin(), staged_.begin() + static_cast<std::ptrdiff_t>(i));
      discard();
      throw WriteError("cannot write " + file.string() + ": " + ec.message());
    }
  }
  staged_.clear();
}

std::vector<fs::path> StagedWrites::targets() const {
  std::vector<fs::path> files;
  files.reserve(staged_.size());
  for (const auto& [temp, file] : staged_) files.push_back(file);
  return files;
}

void write_atomically(const fs::path& file, const std::function<void(std::ostream&)>& body) {
  StagedWrites writes;
  writes.stage(file, body);
  writes.commit();
}

void write_atomically(const fs::path& file, std::string_view text) {
  StagedWrites writes;
  writes.stage(file, text);
  writes.commit();
}

}  // namespace stratasim::files
