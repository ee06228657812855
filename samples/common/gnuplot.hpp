// Plots a sample's metrics CSV as an SVG through gnuplot, when gnuplot is installed: one panel
// per title, each a set of columns against the first one. No shell and no user text in the
// script: gnuplot runs from an argument vector in the output folder, the script (file names
// relative to the folder) on its stdin and the SVG from its stdout, so an --out such as
// 'x;touch y;#' is only a folder's name (it was pasted into a shell command line, and ran).
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/core.h>

#include <string>
#include <utility>
#include <vector>

#include "output_file.hpp"

extern char** environ;

namespace samples {

struct PlotPanel {
  std::string title;
  std::vector<std::pair<int, std::string>> series;  // CSV column (1-based) and its legend
};

// `text` as a gnuplot string: single quotes, an inner one doubled.
inline std::string gnuplot_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Runs gnuplot in `dir` on the script `script` (an open file at offset 0) as its stdin, its
// stdout into `svg`; whether it ran and succeeded.
inline bool run_gnuplot(const std::string& dir, int script, int svg) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, script, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, svg, STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  char program[] = "gnuplot";
  char* argv[] = {program, nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, program, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return false;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Writes `out_dir`/plot.gp and runs it on `out_dir`/`csv_name` into `out_dir`/metrics.svg; says
// where the plot went, or that it was skipped. Every file goes through OutputFile.
inline void plot_metrics(const std::string& out_dir, const std::string& csv_name, const std::string& x_label,
                         const std::vector<PlotPanel>& panels) {
  std::string script = fmt::format("set terminal svg size {},400\nset datafile separator ','\nset key autotitle columnhead\n"
                                   "set multiplot layout 1,{}\nset xlabel {}\n",
                                   450 * panels.size(), panels.size(), gnuplot_quoted(x_label));
  for (const PlotPanel& panel : panels) {
    script += "set title " + gnuplot_quoted(panel.title) + "\nplot ";
    for (size_t i = 0; i < panel.series.size(); ++i)
      script += fmt::format("{}{} using 1:{} with linespoints title {}", i ? ", " : "", gnuplot_quoted(csv_name),
                            panel.series[i].first, gnuplot_quoted(panel.series[i].second));
    script += "\n";
  }
  script += "unset multiplot\n";
  OutputFile gp = OutputFile::replacing(out_dir, "plot.gp");
  gp.write(script);
  gp.commit();
  OutputFile svg = OutputFile::replacing(out_dir, "metrics.svg");
  if (::lseek(gp.fd(), 0, SEEK_SET) == 0 && run_gnuplot(out_dir, gp.fd(), svg.fd())) {
    svg.commit();
    fmt::print("plot: {}/metrics.svg\n", out_dir);
  } else {
    fmt::print("plot skipped (gnuplot not found, or it failed); metrics are in {}/{}\n", out_dir, csv_name);
  }
}

}  // namespace samples
