// Processes that keep this machine's cores busy, as a build or another job beside a test would.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

// Processes that spin on every core of this machine while they live. Each also ends with this
// process (a test that crashes leaves none behind) and after five minutes at most.
class SpinningProcesses {
 public:
  SpinningProcesses() {
    for (long core = 0; core < sysconf(_SC_NPROCESSORS_ONLN); ++core) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(300);
        volatile uint64_t spins = 0;
        for (;;) spins = spins + 1;
      }
      if (pid < 0) {
        stop();
        FAIL("fork failed");
      }
      children_.push_back(pid);
    }
  }
  ~SpinningProcesses() { stop(); }

 private:
  void stop() {
    for (pid_t pid : children_) kill(pid, SIGKILL);
    for (pid_t pid : children_) waitpid(pid, nullptr, 0);
    children_.clear();
  }

  std::vector<pid_t> children_;
};
