// Fairness to other processes: the GPT training step on one device, on dp=2 and pipelined over
// pp=2 (1F1B, 4 microbatches), timed on a quiet machine and again beside a CPU-bound process
// that runs one spinning thread per core (a compiler, another job: what laptops, CI runners and
// shared servers always have). Prints each step's slowdown against its quiet time, next to the
// fair one: the cores the step's threads would get if the scheduler split them evenly among
// every busy thread (2x on 2 cores beside 2 spinning threads). A device that splits its kernels
// over helper threads waits for a core for each at every kernel; comm/machine_load.hpp says what
// the runtime does about it.
// Usage: contention_bench [--width C] [--layers L] [--context T] [--batch B] [--steps N]
//        [--neighbour-threads K] (default: one per core) [--case "1 device"] [--case dp=2] [--case pp=2]
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"
#include "jit/device_workers.hpp"
#include "gpt_step_timing.hpp"

extern char** environ;

using namespace tessera;

namespace {

// The neighbour: `threads` threads spinning on arithmetic until killed.
[[noreturn]] void spin_forever(int threads) {
  std::vector<std::thread> spinning;
  for (int t = 0; t < threads; ++t)
    spinning.emplace_back([] {
      volatile uint64_t x = 1;
      for (;;) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    });
  for (std::thread& t : spinning) t.join();
  std::abort();
}

// A process of this binary spinning `threads` threads, stopped when it goes out of scope.
class Neighbour {
 public:
  explicit Neighbour(int threads) {
    const std::string count = std::to_string(threads);
    char self[] = "/proc/self/exe";
    char flag[] = "--spin";
    std::vector<char> count_text(count.begin(), count.end());
    count_text.push_back('\0');
    char* argv[] = {self, flag, count_text.data(), nullptr};
    if (posix_spawn(&pid_, "/proc/self/exe", nullptr, nullptr, argv, environ) != 0)
      throw Error("contention_bench: could not start the neighbour process");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let its threads reach full speed
  }
  ~Neighbour() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  Neighbour(const Neighbour&) = delete;
  Neighbour& operator=(const Neighbour&) = delete;

 private:
  pid_t pid_ = -1;
};

struct Case {
  std::string name;
  int64_t device_threads;  // virtual devices: a thread each, and helpers on the cores they own
  std::function<double()> median_step;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--spin") spin_forever(std::stoi(argv[2]));
  GptConfig config;
  config.vocab = 96, config.context = 64, config.layers = 4, config.width = 128, config.heads = 4;
  int64_t batch = 16;
  int steps = 7;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  int neighbour_threads = cores;
  std::vector<std::string> only;
  CLI::App app{"GPT training steps on a quiet machine and beside a CPU-bound process"};
  app.add_option("--width", config.width);
  app.add_option("--layers", config.layers);
  app.add_option("--context", config.context);
  app.add_option("--batch", batch, "sequences per step (global)");
  app.add_option("--steps", steps, "timed steps per median");
  app.add_option("--neighbour-threads", neighbour_threads, "spinning threads of the neighbour process (default: one per core)");
  app.add_option("--case", only, "run only these steps (\"1 device\", \"dp=2\", \"pp=2\")");
  CLI11_PARSE(app, argc, argv);
  auto wanted = [&](const std::string& name) {
    return only.empty() || std::any_of(only.begin(), only.end(), [&](const std::string& o) { return name.find(o) != std::string::npos; });
  };
  try {
    std::vector<Case> cases;
    auto gpt_case = [&](const std::string& name, const Mesh& mesh) {
      auto step = std::make_shared<GptTrainingStep>(config, mesh);
      auto [ids, targets] = bench::synthetic_gpt_batch(mesh, config, batch);
      cases.push_back({name, mesh.size(), [=] {
                         bench::warm_up([&] { (void)(*step)(ids, targets).full_tensor(); });
                         return bench::median_step_seconds(*step, ids, targets, steps);
                       }});
    };
    gpt_case("GPT step, 1 device", create_mesh({{"dp", 1}}));
    gpt_case("GPT step, dp=2", create_mesh({{"dp", 2}}));
    const Mesh pp = create_mesh({{"pp", 2}});
    auto pipelined = std::make_shared<PipelinedGptTrainingStep>(config, pp, 4, PipelineSchedule::OneFOneB);
    auto [ids, targets] = bench::synthetic_gpt_batch(pp, config, batch);
    cases.push_back({"GPT step, pp=2 1F1B x4", 2, [=] {
                       bench::warm_up([&] { (void)(*pipelined)(ids, targets).full_tensor(); });
                       return bench::median_step_seconds(*pipelined, ids, targets, steps);
                     }});

    fmt::print("{} cores; the neighbour spins {} threads. Median of {} steps, quiet / beside it / quiet again.\n", cores,
               neighbour_threads, steps);
    fmt::print("{:<26} {:>10} {:>12} {:>10} {:>9} {:>6}\n", "step", "quiet ms", "neighbour ms", "quiet ms", "slowdown", "fair");
    for (const Case& c : cases) {
      if (!wanted(c.name)) continue;
      const double quiet = c.median_step();
      double loaded = 0;
      rusage before{}, after{};
      {
        const Neighbour neighbour(neighbour_threads);
        getrusage(RUSAGE_SELF, &before);
        loaded = c.median_step();
        getrusage(RUSAGE_SELF, &after);
      }
      fmt::print(stderr, "{}: beside the neighbour {} voluntary and {} involuntary context switches\n", c.name,
                 after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw);
      const double quiet_again = c.median_step();
      // Each busy thread gets cores / (ours + the neighbour's) of a core, where ours (every
      // device's share of the cores: its thread and its helpers) had min(1, cores / ours) alone.
      const double ours = double(std::min<int64_t>(cores, c.device_threads * cores_per_device(c.device_threads)));
      const double all = ours + neighbour_threads;
      const double fair = std::min(1.0, cores / ours) / std::min(1.0, cores / all);
      fmt::print("{:<26} {:>10.2f} {:>12.2f} {:>10.2f} {:>8.2f}x {:>5.2f}x\n", c.name, quiet * 1e3, loaded * 1e3, quiet_again * 1e3,
                 loaded / std::min(quiet, quiet_again), fair);
    }
  } catch (const Error& e) {
    fmt::print(stderr, "contention_bench: {}\n", e.what());
    return 1;
  }
}
