// The import dispatcher: a format name to its importer (traces/chakra.hpp, traces/kineto.hpp,
// traces/timeline_import.hpp).
#include "traces/import.hpp"

#include "traces/chakra.hpp"
#include "traces/kineto.hpp"
#include "traces/timeline_import.hpp"

namespace stratasim::traces {

TraceError::TraceError(std::string file, std::string where, std::string message)
    : std::runtime_error(file + (where.empty() ? "" : ": " + where) + ": " + message),
      file_(std::move(file)),
      where_(std::move(where)),
      message_(std::move(message)) {}

std::string_view name_of(TraceFormat f) {
  switch (f) {
    case TraceFormat::chakra:
      return "chakra";
    case TraceFormat::kineto:
      return "kineto";
    case TraceFormat::stratasim:
      return "stratasim";
  }
  return "?";
}

std::optional<TraceFormat> trace_format_from_name(std::string_view name) {
  for (TraceFormat f : {TraceFormat::chakra, TraceFormat::kineto, TraceFormat::stratasim}) {
    if (name_of(f) == name) return f;
  }
  return std::nullopt;
}

ImportedTrace import_trace(const std::filesystem::path& path, TraceFormat format) {
  switch (format) {
    case TraceFormat::chakra:
      return import_chakra(path);
    case TraceFormat::kineto:
      return import_kineto(path);
    case TraceFormat::stratasim:
      return import_timeline(path).trace;
  }
  throw TraceError(path.string(), "", "unknown trace format");
}

}  // namespace stratasim::traces
