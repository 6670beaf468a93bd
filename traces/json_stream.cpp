// A SAX handler (nlohmann::json::sax_parse) that builds only what the request keeps; see
// traces/json_stream.hpp.
//
// Each open container has a frame saying what its values become: the root object's values are
// members (streamed, kept or skipped); a streamed array's values are elements; a value being
// built adds its values to itself, as nlohmann's own DOM parser does (an object's key names the
// member the next value fills; a repeated key overwrites); a skipped value's values are
// skipped. The nesting bound is checked where nlohmann::json::parse's callback would see it:
// at every value and key, with the number of containers open around it.
#include "traces/json_stream.hpp"

#include <algorithm>
#include <cstddef>
#include <istream>
#include <type_traits>
#include <utility>

#include "hw_models/config_reader.hpp"
#include "hw_models/json_depth.hpp"

namespace stratasim::traces {

namespace {

using nlohmann::json;

class Handler {
 public:
  Handler(const JsonStreamRequest& request, const std::string& source, JsonStreamResult& result)
      : request_(request), source_(source), result_(result) {}

  bool null() { return scalar(nullptr); }
  bool boolean(bool v) { return scalar(v); }
  bool number_integer(json::number_integer_t v) { return scalar(v); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(v); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return scalar(v); }
  bool string(json::string_t& v) { return scalar(v); }
  bool binary(json::binary_t& v) { return scalar(std::move(v)); }  // not in JSON text
  bool start_object(std::size_t /*size*/) { return open(json::value_t::object); }
  bool start_array(std::size_t /*size*/) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    bound_depth();
    Frame& f = frames_.back();
    if (f.role == Role::root_object) {
      member_ = k;
    } else if (f.role == Role::build) {
      member_slot_ = &(*f.value)[k];
    }
    return true;
  }

  // nlohmann's DOM parser throws the exception as its own type (parse_error, out_of_range).
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*token*/, const Exception& e) {
    throw e;
  }

 private:
  enum class Role { skip, root_object, stream_array, build };
  struct Frame {
    Role role;
    json* value;  // the value built, for Role::build
  };
  // Where a value that begins goes: the role of its frame if it is a container, and the value
  // to fill (nullptr: not built).
  struct Slot {
    Role role;
    json* value;
  };

  void bound_depth() const {
    if (frames_.size() > static_cast<std::size_t>(config::kMaxJsonDepth)) {
      throw config::ConfigError(source_, "", config::json_too_deep_message());
    }
  }

  Slot member(json::value_t type) {
    if (member_ == request_.array) {
      const std::size_t occurrence = result_.array_occurrences++;
      result_.array_type = type;
      result_.array_size = 0;
      streaming_ = request_.on_element && occurrence == request_.occurrence;
      return {type == json::value_t::array ? Role::stream_array : Role::skip, nullptr};
    }
    if (std::find(request_.keep.begin(), request_.keep.end(), member_) != request_.keep.end()) {
      json& slot = result_.kept[member_];
      slot = json();
      return {Role::build, &slot};
    }
    return {Role::skip, nullptr};
  }

  Slot begin_value(json::value_t type) {
    if (frames_.empty()) {  // the root
      result_.root = type;
      if (type == json::value_t::array) {
        result_.array_type = type;
        streaming_ = static_cast<bool>(request_.on_element);
        return {Role::stream_array, nullptr};
      }
      return {type == json::value_t::object ? Role::root_object : Role::skip, nullptr};
    }
    const Frame& parent = frames_.back();
    switch (parent.role) {
      case Role::root_object:
        return member(type);
      case Role::stream_array:
        if (!streaming_) return {Role::skip, nullptr};
        element_ = json();
        return {Role::build, &element_};
      case Role::build:
        if (parent.value->is_array()) {
          auto& array = parent.value->get_ref<json::array_t&>();
          array.emplace_back();
          return {Role::build, &array.back()};
        }
        return {Role::build, member_slot_};
      case Role::skip:
        break;
    }
    return {Role::skip, nullptr};
  }

  // A value is complete: an element of the streamed array is handed over and counted.
  void end_value() {
    if (frames_.empty() || frames_.back().role != Role::stream_array) return;
    if (streaming_) {
      request_.on_element(result_.array_size, element_);
      element_ = json();
    }
    ++result_.array_size;
  }

  template <class V>
  static constexpr json::value_t type_of() {
    using T = std::decay_t<V>;
    if constexpr (std::is_same_v<T, std::nullptr_t>) return json::value_t::null;
    if constexpr (std::is_same_v<T, bool>) return json::value_t::boolean;
    if constexpr (std::is_same_v<T, json::number_integer_t>) return json::value_t::number_integer;
    if constexpr (std::is_same_v<T, json::number_unsigned_t>) {
      return json::value_t::number_unsigned;
    }
    if constexpr (std::is_same_v<T, json::number_float_t>) return json::value_t::number_float;
    if constexpr (std::is_same_v<T, json::string_t>) return json::value_t::string;
    return json::value_t::binary;
  }

  template <class V>
  bool scalar(V&& v) {
    bound_depth();
    const Slot slot = begin_value(type_of<V>());
    if (slot.value != nullptr) *slot.value = json(std::forward<V>(v));
    end_value();
    return true;
  }

  bool open(json::value_t type) {
    bound_depth();
    const Slot slot = begin_value(type);
    if (slot.value != nullptr) *slot.value = json(type);
    frames_.push_back({slot.role, slot.value});
    return true;
  }

  bool close() {
    frames_.pop_back();
    end_value();
    return true;
  }

  const JsonStreamRequest& request_;
  const std::string& source_;
  JsonStreamResult& result_;
  std::vector<Frame> frames_;
  std::string member_;           // the root member whose value comes next
  json* member_slot_ = nullptr;  // the member of a built object that the next value fills
  json element_;                 // the element being built
  bool streaming_ = false;       // the array open now hands its elements over
};

}  // namespace

JsonStreamResult stream_json(JsonText text, const JsonStreamRequest& request,
                             const std::string& source) {
  JsonStreamResult result;
  Handler handler(request, source, result);
  if (const auto* s = std::get_if<std::string_view>(&text)) {
    json::sax_parse(s->begin(), s->end(), &handler);
  } else {
    json::sax_parse(*std::get<std::istream*>(text), &handler);
  }
  return result;
}

}  // namespace stratasim::traces
