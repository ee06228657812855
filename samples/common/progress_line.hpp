// The samples' progress bar. On a terminal it redraws one line in place, as tqdm and Keras do;
// when stdout is a file or a pipe (a log, CI) it prints a plain line each time another tenth of
// the work is done, and at the end, instead of filling the log with carriage returns.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace samples {

class ProgressLine {
 public:
  explicit ProgressLine(bool terminal = ::isatty(::fileno(stdout)) != 0) : terminal_(terminal) {}

  // What to print for `done` of `total` (the bar and `details`); empty when nothing is due.
  // A new total starts a new line (a new epoch).
  std::string update(int64_t done, int64_t total, const std::string& label, const std::string& details) {
    if (total != total_) total_ = total, tenths_printed_ = -1;
    const int64_t safe_total = total > 0 ? total : 1;
    const int width = 30, filled = int(width * done / safe_total);
    const std::string line = label + " [" + std::string(size_t(filled), '#') + std::string(size_t(width - filled), '.') + "] " + details;
    if (terminal_) {
      drawn_ = true;
      return "\r" + line + "   ";
    }
    const int64_t tenths = 10 * done / safe_total;
    if (tenths <= tenths_printed_ && done != total) return "";
    if (done == total && tenths_printed_ == 10) return "";
    tenths_printed_ = done == total ? 10 : tenths;
    return line + "\n";
  }

  // What ends the bar's line before other output: a newline after an in-place bar, else nothing.
  std::string end_line() {
    const bool was_drawn = drawn_;
    drawn_ = false;
    return was_drawn ? "\n" : "";
  }

 private:
  bool terminal_;
  bool drawn_ = false;
  int64_t total_ = -1, tenths_printed_ = -1;
};

}  // namespace samples
