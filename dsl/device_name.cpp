#include "dsl/device_name.hpp"

#include <charconv>

#include "dsl/error.hpp"

namespace tessera {
namespace {

bool parse_int(std::string_view text, int64_t& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out >= 0;
}

[[noreturn]] void malformed(std::string_view text, std::string_view why) {
  throw MeshError("malformed device name '" + std::string(text) + "': " + std::string(why) +
                  " (expected 'CPU:0' or '/job:localhost/replica:0/task:0/device:CPU:0')");
}

// "TYPE:INDEX" with TYPE in {CPU, GPU}.
void parse_short(std::string_view whole, std::string_view part, DeviceName& out) {
  auto colon = part.find(':');
  if (colon == std::string_view::npos) malformed(whole, "no ':' between type and index");
  out.type = std::string(part.substr(0, colon));
  if (!device_kind_from_name(out.type))
    malformed(whole, "unknown device type '" + out.type + "' (Tessera knows CPU and GPU)");
  if (!parse_int(part.substr(colon + 1), out.index)) malformed(whole, "bad device index");
}

}  // namespace

DeviceKind DeviceName::kind() const {
  if (auto kind = device_kind_from_name(type)) return *kind;
  throw MeshError("device " + to_string() + " has no backend (CPU and GPU devices have)");
}

DeviceName DeviceName::parse(std::string_view text) {
  DeviceName out;
  if (text.empty()) malformed(text, "empty");
  if (text.front() != '/') {
    parse_short(text, text, out);
    return out;
  }
  // "/job:J/replica:R/task:T/device:TYPE:INDEX"
  out.written_in_full = true;
  std::string_view rest = text.substr(1);
  bool saw_device = false;
  while (!rest.empty()) {
    auto slash = rest.find('/');
    std::string_view field = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    auto colon = field.find(':');
    if (colon == std::string_view::npos) malformed(text, "field '" + std::string(field) + "' has no ':'");
    std::string_view key = field.substr(0, colon), value = field.substr(colon + 1);
    if (key == "job") {
      if (value.empty()) malformed(text, "empty job");
      out.job = std::string(value);
    } else if (key == "replica") {
      if (!parse_int(value, out.replica)) malformed(text, "bad replica");
    } else if (key == "task") {
      if (!parse_int(value, out.task)) malformed(text, "bad task");
    } else if (key == "device") {
      parse_short(text, value, out);
      saw_device = true;
    } else {
      malformed(text, "unknown field '" + std::string(key) + "'");
    }
  }
  if (!saw_device) malformed(text, "no device field");
  return out;
}

std::string DeviceName::to_string() const {
  if (!written_in_full && job == "localhost" && replica == 0 && task == 0) return type + ":" + std::to_string(index);
  return full_string();
}

bool DeviceName::operator==(const DeviceName& other) const {
  return job == other.job && replica == other.replica && task == other.task && type == other.type && index == other.index;
}

std::string DeviceName::full_string() const {
  return "/job:" + job + "/replica:" + std::to_string(replica) + "/task:" + std::to_string(task) +
         "/device:" + type + ":" + std::to_string(index);
}

}  // namespace tessera
