// Small string helpers shared by the parsers and printers of dsl/.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dsl/source_location.hpp"
#include "dsl/user_frame.hpp"

namespace tessera {

// Splits on `sep`; "a,,b" gives {"a", "", "b"}, "" gives {""}.
inline std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    out.emplace_back(text.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

// "file.cpp:12": a source location's file name (without directories) and line.
inline std::string source_line(const SourceLocation& where) {
  std::string_view file = where.file_name();
  if (auto slash = file.rfind('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return std::string(file) + ":" + std::to_string(where.line());
}

// " (at file.cpp:12)": how error messages name the user's line (user_frame: inside a library
// module, the line that called it).
inline std::string at_line(const SourceLocation& where) { return " (at " + source_line(user_frame(where)) + ")"; }

inline std::string_view trim(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

inline bool parse_int64(std::string_view text, int64_t& out) {
  text = trim(text);
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

template <class Range, class Fn>
std::string join(const Range& items, std::string_view sep, Fn&& to_text) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += sep;
    out += to_text(item);
    first = false;
  }
  return out;
}

// Items that are text already.
template <class Range>
std::string join(const Range& items, std::string_view sep) {
  return join(items, sep, [](const auto& item) -> std::string_view { return item; });
}

// "(6, 4)" / "(2,)" / "()": Python's tuple form, used for shapes in messages and printing.
inline std::string shape_string(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return "(" + std::to_string(shape[0]) + ",)";
  return "(" + join(shape, ", ", [](int64_t v) { return std::to_string(v); }) + ")";
}

// "1.50 GiB", "12 B"; "3.250 ms", "41.0 us": sizes and times as reports print them.
inline std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  for (; bytes >= 1024 && u < 4; ++u) bytes /= 1024;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}
inline std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

}  // namespace tessera
