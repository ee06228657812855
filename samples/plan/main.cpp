// Plans a transformer training job before paying for it (a GPT of the given shape, or a preset:
// --model llama3-70b): which mesh (pipeline x data x expert x sequence x tensor parallel), with
// or without Megatron's sequence parallelism, fully sharded parameters and recomputation, is
// fastest on N devices of some hardware within a memory budget; or, with --plan, what exactly one
// chosen plan costs. Nothing runs: every candidate is compiled and memory-planned on an abstract
// mesh (docs/PLANNING.md). --batch is the global batch: sequences per step.
//   plan --layers 96 --width 12288 --heads 96 --seq 2048 --batch 1536 --devices 1024
//        --hardware h100-sxm --memory 80GiB [--json] [--svg frontier.svg]
//   plan --model llama3-70b --seq 8192 --batch 512 --devices 512 --hardware a100-sxm4-80gb
//   plan --model llama3-70b --batch 512 --plan "pp=4,dp=16,tp=8" --microbatches 32 --recompute full
//        --precision bf16 --sequence-parallel [--breakdown]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
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

// --hardware: a published profile's name ("this-machine" measures this one), or a JSON file in
// hardware_from_json's format.
Hardware hardware_named(const std::string& name) {
  const bool file = name.ends_with(".json") || name.find('/') != std::string::npos;
  if (!file) return hardware_profile(name);
  std::ifstream in(name);
  if (!in) throw IOError("--hardware '" + name + "': cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  return hardware_from_json(text.str());
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
  int64_t batch = 1536, devices = 1024, per_node = 8, microbatches = 0;
  std::string hardware = "h100-sxm", memory = "80GiB", svg_path, precision = "search", plan, recompute = "none";
  bool json = false, sequence_parallel = false, fsdp = false, breakdown = false;
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
  app.add_option("--batch", batch, "the global batch: sequences per step");
  CLI::Option* devices_flag = app.add_option("--devices", devices, "devices in the job (with --plan: its mesh's, by default)");
  app.add_option("--devices-per-node", per_node, "devices sharing the fast links");
  app.add_option("--hardware", hardware, [] {
    std::string names;
    for (const std::string& n : published_hardware_names()) names += n + ", ";
    return names + "this-machine, or a JSON file in hardware_from_json's format (FILE.json)";
  }());
  app.add_option("--memory", memory, "memory budget per device (80GiB, 80GB, bytes)");
  app.add_option("--precision", precision,
                 "search (f32 and bf16 both tried), f32, or bf16 mixed precision (f32 master weights, gradients reduced in f32)")
      ->check(CLI::IsMember({"search", "f32", "bf16"}));
  app.add_option("--plan", plan, "evaluate exactly this plan instead of searching: its mesh, e.g. \"pp=8,dp=16,tp=8\"");
  app.add_option("--microbatches", microbatches,
                 "with --plan: microbatches a step (1F1B with pp, gradient accumulation without; default 2 x pp with pp, else 1)");
  app.add_option("--recompute", recompute, "with --plan: activation recomputation of each block")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_flag("--sequence-parallel", sequence_parallel, "with --plan: Megatron's sequence parallelism on tp");
  app.add_flag("--fsdp", fsdp, "with --plan: parameters, gradients and optimizer state fully sharded over dp");
  app.add_flag("--breakdown", breakdown, "with --plan: the plan's collectives and its time by op kind and by module");
  app.add_flag("--json", json, "print JSON instead of the table");
  app.add_option("--svg", svg_path, "write the memory/time frontier of the candidates here");
  CLI11_PARSE(app, argc, argv);
  // Each flag by its name (the library's checks name GptConfig's fields); --batch 0 would mean
  // auto_parallelize's one sequence per device, here a mistake.
  for (const auto& [flag, value] : {std::pair{"--layers", config.layers}, std::pair{"--width", config.width}, std::pair{"--heads", config.heads},
                                    std::pair{"--seq", config.context}, std::pair{"--vocab", config.vocab}, std::pair{"--batch", batch},
                                    std::pair{"--devices", devices}, std::pair{"--devices-per-node", per_node}})
    if (value < 1) throw Error(fmt::format("{} {}: must be at least 1", flag, value));
  if (plan.empty())
    for (const auto& [flag, given] : {std::pair{"--microbatches", app.count("--microbatches") > 0}, std::pair{"--recompute", app.count("--recompute") > 0},
                                      std::pair{"--sequence-parallel", sequence_parallel}, std::pair{"--fsdp", fsdp},
                                      std::pair{"--breakdown", breakdown}})
      if (given) throw Error(std::string(flag) + ": only with --plan (the search tries the options itself)");
  if (!preset.empty())  // a preset's shape is the published one: a size beside it would be ignored
    for (const char* flag : {"--layers", "--width", "--heads", "--vocab"})
      if (app.count(flag) > 0) throw Error(fmt::format("{}: not with --model {} (its shape is the preset's; --seq sets its sequence length)", flag, preset));
  const int64_t budget = parse_bytes(memory);
  if (precision == "bf16") config.mixed_precision = kBf16MixedPrecision;
  const Hardware hw = hardware_named(hardware);
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
  ParallelPlanSearch search;
  if (plan.empty()) {
    search = auto_parallelize(*model, devices, hw, budget, batch, per_node, precision == "search");
  } else {
    // Exactly the plan given: its mesh, microbatches, recomputation and precision.
    const auto started = std::chrono::steady_clock::now();
    ParallelCandidate chosen;
    chosen.mesh = parse_plan_mesh(plan);
    int64_t plan_devices = 1;
    for (const auto& [dim, size] : chosen.mesh) plan_devices *= size;
    if (devices_flag->count() > 0 && devices != plan_devices)
      throw Error(fmt::format("--plan {} has {} devices, --devices says {}", plan, plan_devices, devices));
    devices = plan_devices;
    if (app.count("--microbatches") > 0 && microbatches < 1) throw Error(fmt::format("--microbatches {}: must be at least 1", microbatches));
    chosen.microbatches = microbatches > 0 ? microbatches : chosen.pipelined() ? 2 * chosen.size("pp") : 1;
    chosen.sequence_parallel = sequence_parallel;
    chosen.fsdp = fsdp;
    if (recompute != "none") chosen.activation_checkpointing = recompute == "full" ? CheckpointPolicy::Full : CheckpointPolicy::Selective;
    chosen.mixed_precision = config.mixed_precision;
    search.best = evaluate_plan(model->config(), chosen, hw, budget, batch, per_node);
    search.candidates = {search.best};
    search.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    search.why = fmt::format("{} (the plan given): predicted {} per step with {} of {} per device{}", search.best.name(),
                             seconds_text(search.best.report.predicted_seconds), bytes_text(double(search.best.report.peak_bytes)),
                             bytes_text(double(budget)), search.best.fits ? "" : ": it does not fit");
  }
  if (json) {
    fmt::print("{}\n", search.to_json(breakdown));
  } else {
    const std::string precisions = precision == "search" ? (plan.empty() ? "f32 or bf16" : "f32") : precision;
    fmt::print("{}, sequence {}, vocabulary {}, batch {}, {}; {} x {} ({} a node), {} each\n", description, config.context, config.vocab,
               batch, precisions, devices, hw.name, per_node, memory);
    fmt::print("{}", search.to_string());
    if (breakdown) fmt::print("{}", search.best.report.to_string());
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
