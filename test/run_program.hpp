// Runs a program (a sample) from an argument vector, no shell, as a user would from a terminal:
// its exit code and everything it printed, for tests of what command lines it refuses and of
// what it does to the files around it.
#pragma once

#include <string>
#include <vector>

namespace tessera::testing {

struct ProgramRun {
  int exit_code = 0;    // the program's status; 128 + the signal that ended it; -1 if it never ran
  bool timed_out = false;  // killed after the time limit
  std::string output;   // stdout and stderr, interleaved as written
};

// `program` with `args`, killed after `timeout_seconds`.
ProgramRun run_program(const std::string& program, const std::vector<std::string>& args, double timeout_seconds = 120);

}  // namespace tessera::testing
