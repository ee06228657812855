#include "run_program.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

extern char** environ;

namespace tessera::testing {

ProgramRun run_program(const std::string& program, const std::vector<std::string>& args, double timeout_seconds) {
  ProgramRun run;
  // The output goes to a file, not a pipe: nothing to drain while waiting.
  std::string log = (std::filesystem::temp_directory_path() / "tessera-run-XXXXXX").string();
  const int log_fd = ::mkostemp(log.data(), O_CLOEXEC);
  if (log_fd < 0) {
    run.exit_code = -1;
    run.output = "cannot create a log file";
    return run;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  std::vector<std::string> owned = {program};
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(log_fd);
  if (spawned != 0) {
    run.exit_code = -1;
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        run.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::ifstream in(log, std::ios::binary);
  run.output.assign(std::istreambuf_iterator<char>(in), {});
  std::filesystem::remove(log);
  return run;
}

}  // namespace tessera::testing
