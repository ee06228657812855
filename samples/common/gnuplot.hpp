// Plots a samples' metrics CSV as an SVG through gnuplot, when gnuplot is installed: one panel
// per title, each a set of columns against the first one.
#pragma once

#include <fmt/core.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace samples {

struct PlotPanel {
  std::string title;
  std::vector<std::pair<int, std::string>> series;  // CSV column (1-based) and its legend
};

// Writes `out_dir`/plot.gp and runs it into `out_dir`/metrics.svg; says where the plot went, or
// that it was skipped.
inline void plot_metrics(const std::string& csv, const std::string& out_dir, const std::string& x_label,
                         const std::vector<PlotPanel>& panels) {
  const std::string script = out_dir + "/plot.gp";
  std::ofstream gp(script);
  gp << "set terminal svg size " << 450 * panels.size() << ",400\nset output '" << out_dir << "/metrics.svg'\n"
     << "set datafile separator ','\nset key autotitle columnhead\nset multiplot layout 1," << panels.size() << "\n"
     << "set xlabel '" << x_label << "'\n";
  for (const PlotPanel& panel : panels) {
    gp << "set title '" << panel.title << "'\nplot ";
    for (size_t i = 0; i < panel.series.size(); ++i)
      gp << (i ? ", " : "") << "'" << csv << "' using 1:" << panel.series[i].first << " with linespoints title '"
         << panel.series[i].second << "'";
    gp << "\n";
  }
  gp << "unset multiplot\n";
  gp.close();
  if (std::system(("gnuplot " + script + " 2>/dev/null").c_str()) == 0) fmt::print("plot: {}/metrics.svg\n", out_dir);
  else fmt::print("plot skipped (gnuplot not found); metrics are in {}\n", csv);
}

}  // namespace samples
