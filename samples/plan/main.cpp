// Plans a transformer training job before paying for it (a GPT of the given shape, or a preset:
// --model llama3-70b): which mesh (data x sequence x tensor
// parallel), with or without Megatron's sequence parallelism and fully sharded parameters, is
// fastest on N devices of some hardware within a memory budget. Nothing runs: every candidate is
// compiled and memory-planned on an abstract mesh (docs/PLANNING.md).
//   plan --layers 96 --width 12288 --heads 96 --seq 2048 --batch 1536 --devices 1024
//        --hardware h100-sxm --memory 80GiB [--json] [--svg frontier.svg]
//   plan --model llama3-70b --seq 8192 --batch 512 --devices 512
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <tessera/tessera.hpp>

#include "../common/report_errors.hpp"

using namespace tessera;

namespace {

// "80GiB", "80GB", "1.5TiB", "123456": bytes. Error saying what is wrong with anything else:
// not a number, an unknown unit, not finite (nan, inf), not positive, or more bytes than int64
// holds (a cast would have wrapped 1e30GiB to a negative budget).
int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::out_of_range&) {
    throw Error("--memory '" + text + "': the number is outside a double's range; the budget is 1 to 9223372036854775807 bytes");
  } catch (const std::exception&) {
    throw Error("--memory '" + text + "' is not a size (80GiB, 80GB, 123456)");
  }
  const std::string unit = text.substr(used);
  const std::pair<const char*, double> units[] = {{"", 1},         {"B", 1},          {"KiB", 1024.0},       {"MiB", 1048576.0},
                                                  {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
                                                  {"GB", 1e9},     {"TB", 1e12}};
  for (const auto& [name, scale] : units) {
    if (unit != name) continue;
    if (!std::isfinite(value)) throw Error("--memory '" + text + "' is not finite; give a size such as 80GiB");
    const double bytes = value * scale;
    if (!(bytes >= 1)) throw Error("--memory '" + text + "' is " + fmt::format("{}", bytes) + " bytes; the budget must be at least 1 byte");
    // 2^63 is the first double past int64.
    if (bytes >= 0x1p63)
      throw Error("--memory '" + text + "' is " + fmt::format("{:.3g}", bytes) + " bytes, more than the int64 limit of 9223372036854775807 bytes");
    return int64_t(bytes);
  }
  throw Error("--memory: unknown unit '" + unit + "' in '" + text + "' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
}

// Predicted step time against peak memory per device, one dot per candidate; the budget a
// dashed line, the winner filled.
std::string frontier_svg(const ParallelPlanSearch& search, int64_t budget) {
  const double w = 720, h = 480, left = 80, bottom = 60, top = 40, right = 30;
  double t_max = 0, m_max = double(budget);
  for (const auto& c : search.candidates) {
    t_max = std::max(t_max, c.report.predicted_seconds);
    m_max = std::max(m_max, double(c.report.peak_bytes));
  }
  t_max *= 1.05;
  m_max *= 1.05;
  auto x = [&](double t) { return left + (w - left - right) * t / t_max; };
  auto y = [&](double m) { return h - bottom - (h - bottom - top) * m / m_max; };
  std::string svg = fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">)svg", w, h);
  svg += fmt::format(R"svg(<text x="{}" y="24" font-size="14">{}</text>)svg", left, "candidates: predicted step time vs. peak memory per device");
  svg += fmt::format(R"svg(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black"/><line x1="{0}" y1="{1}" x2="{0}" y2="{3}" stroke="black"/>)svg",
                     left, h - bottom, w - right, top);
  svg += fmt::format(R"svg(<text x="{}" y="{}">predicted step (s), 0 to {:.3g}</text>)svg", left + 200, h - 20, t_max);
  svg += fmt::format(R"svg(<text x="14" y="{}" transform="rotate(-90 14 {})">peak per device (GiB), 0 to {:.3g}</text>)svg", h / 2 + 90,
                     h / 2 + 90, m_max / double(int64_t(1) << 30));
  svg += fmt::format(R"svg(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="red" stroke-dasharray="6 4"/><text x="{3}" y="{4}" fill="red">budget</text>)svg",
                     left, y(double(budget)), w - right, w - right - 50, y(double(budget)) - 4);
  for (const auto& c : search.candidates) {
    const bool best = c.name() == search.best.name();
    svg += fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="{}" fill="{}" stroke="steelblue"><title>{}</title></circle>)svg",
                       x(c.report.predicted_seconds), y(double(c.report.peak_bytes)), best ? 6 : 4, best ? "steelblue" : "none", c.name());
    if (best)
      svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}">{}</text>)svg", x(c.report.predicted_seconds) + 8, y(double(c.report.peak_bytes)) - 8, c.name());
  }
  return svg + "</svg>\n";
}

int run(int argc, char** argv) {
  GptConfig config;
  config.vocab = 50257, config.context = 2048, config.layers = 96, config.width = 12288, config.heads = 96;
  int64_t batch = 1536, devices = 1024, per_node = 8;
  std::string hardware = "h100-sxm", memory = "80GiB", svg_path, precision = "search";
  bool json = false;
  std::string preset;
  CLI::App app{"plan a transformer training job: the fastest mesh and parallel styles that fit, predicted without running"};
  app.add_option("--model", preset, "a preset (" + [] {
    std::string names;
    for (const std::string& n : transformer_preset_names()) names += (names.empty() ? "" : ", ") + n;
    return names;
  }() + ") instead of --layers/--width/--heads/--vocab; --seq sets its sequence length");
  app.add_option("--layers", config.layers, "transformer blocks");
  app.add_option("--width", config.width, "model width");
  app.add_option("--heads", config.heads, "attention heads");
  app.add_option("--seq", config.context, "tokens per sequence");
  app.add_option("--vocab", config.vocab, "vocabulary size");
  app.add_option("--batch", batch, "sequences per step (global)");
  app.add_option("--devices", devices, "devices in the job");
  app.add_option("--devices-per-node", per_node, "devices sharing the fast links");
  app.add_option("--hardware", hardware, "h100-sxm, h200, this-machine");
  app.add_option("--memory", memory, "memory budget per device (80GiB, 80GB, bytes)");
  app.add_option("--precision", precision,
                 "search (f32 and bf16 both tried), f32, or bf16 mixed precision (f32 master weights, gradients reduced in f32)")
      ->check(CLI::IsMember({"search", "f32", "bf16"}));
  app.add_flag("--json", json, "print JSON instead of the table");
  app.add_option("--svg", svg_path, "write the memory/time frontier of the candidates here");
  CLI11_PARSE(app, argc, argv);
  // Each flag by its name (the library's checks name GptConfig's fields); --batch 0 would mean
  // auto_parallelize's one sequence per device, here a mistake.
  for (const auto& [flag, value] : {std::pair{"--layers", config.layers}, std::pair{"--width", config.width}, std::pair{"--heads", config.heads},
                                    std::pair{"--seq", config.context}, std::pair{"--vocab", config.vocab}, std::pair{"--batch", batch},
                                    std::pair{"--devices", devices}, std::pair{"--devices-per-node", per_node}})
    if (value < 1) throw Error(fmt::format("{} {}: must be at least 1", flag, value));
  const int64_t budget = parse_bytes(memory);
  if (precision == "bf16") config.mixed_precision = kBf16MixedPrecision;
  const Hardware hw = hardware_profile(hardware);
  const Mesh where = abstract_mesh({{"dp", 1}}, hw, per_node);
  // The model to plan; nothing allocated. A preset covers --seq tokens a sequence.
  std::unique_ptr<Transformer> model;
  std::string description;
  if (preset.empty()) {
    model = std::make_unique<Gpt>(config, where);
    description = fmt::format("GPT {} layers, width {}, {} heads", config.layers, config.width, config.heads);
  } else {
    TransformerConfig c = transformer_preset(preset);
    c.max_seq = config.context, c.mixed_precision = config.mixed_precision;
    model = std::make_unique<Transformer>(c, where);
    description = fmt::format("{} ({:.1f}B parameters): {} layers, dim {}, {} heads ({} kv), MLP {}", c.name, double(parameter_count(c)) / 1e9,
                              c.layers, c.dim, c.heads, c.kv_heads, c.hidden);
    config.vocab = c.vocab;
  }
  const ParallelPlanSearch search = auto_parallelize(*model, devices, hw, budget, batch, per_node, precision == "search");
  if (json) fmt::print("{}\n", search.to_json());
  else {
    const std::string precisions = precision == "search" ? "f32 or bf16" : precision;
    fmt::print("{}, sequence {}, vocabulary {}, batch {}, {}; {} x {} ({} a node), {} each\n", description, config.context, config.vocab,
               batch, precisions, devices, hw.name, per_node, memory);
    fmt::print("{}", search.to_string());
  }
  if (!svg_path.empty()) {
    std::ofstream out(svg_path);
    out << frontier_svg(search, budget);
    if (!out) throw IOError("cannot write " + svg_path);
  }
  return search.best.fits ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) { return samples::report_errors([&] { return run(argc, argv); }); }
