// tessera::SourceLocation: std::source_location where the standard library provides it.
// libstdc++ 12 defines it only for compilers with __builtin_source_location (GCC 11+, clang
// 15+); clang 14 (the libFuzzer build, scripts/libfuzz.sh) gets the same interface from the
// older __builtin_FILE / __builtin_LINE builtins, which a default argument evaluates at the
// caller just as std::source_location::current() does.
#pragma once

#include <version>

#ifdef __cpp_lib_source_location
#include <source_location>
namespace tessera {
using SourceLocation = std::source_location;
}  // namespace tessera
#else
#include <cstdint>
namespace tessera {
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(), const char* function = __builtin_FUNCTION(),
                                          uint_least32_t line = __builtin_LINE(),
                                          uint_least32_t column = __builtin_COLUMN()) noexcept {
    SourceLocation here;
    here.file_ = file;
    here.function_ = function;
    here.line_ = line;
    here.column_ = column;
    return here;
  }
  constexpr SourceLocation() noexcept = default;
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }
  constexpr uint_least32_t line() const noexcept { return line_; }
  constexpr uint_least32_t column() const noexcept { return column_; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  uint_least32_t line_ = 0, column_ = 0;
};
}  // namespace tessera
#endif
