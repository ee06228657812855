// What a call of a compiled program would cost, worked out without running it (a jit
// function's plan(args...)): per device, the bytes held at the peak, the FLOPs, the bytes each
// collective moves, and a predicted time. Memory and bytes are exact: they are counted from the
// program, schedule and memory plan the executor runs. Time is modelled from a Hardware profile
// (dsl/hardware.hpp): kernels by roofline, GEMMs and attention at the profile's matrix rate,
// collectives by alpha-beta on the link their group uses; steps run one after another, as the
// executor runs them (it overlaps nothing). docs/PLANNING.md says how accurate the model was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsl/hardware.hpp"
#include "dsl/mesh.hpp"
#include "dsl/string_util.hpp"  // bytes_text, seconds_text

namespace tessera {

struct ProgramPlan;

struct PlanReport {
  // Per call: the peak of the most loaded device (every buffer it holds at once: inputs,
  // outputs, the arena, values outside it, collectives' staging); the most FLOPs and collective
  // bytes received (and sent: the algorithms are symmetric) of any device; and the predicted
  // time of one call, its slowest device's.
  int64_t peak_bytes = 0;
  double flops = 0;
  int64_t collective_bytes = 0;
  double predicted_seconds = 0;

  std::string hardware;      // the profile predicted with
  std::string mesh;          // "dp=64,tp=8"
  int64_t devices = 0;       // in the mesh
  int64_t device = 0;        // the most loaded device's global id
  // Its peak, in parts: the program's inputs and outputs, the arena, and the rest (collective
  // results, gathered values, staging) at the moment of the peak.
  int64_t input_bytes = 0, output_bytes = 0, arena_bytes = 0;
  bool fits = true;          // peak_bytes <= the profile's memory_bytes

  // Per planned device (the mesh's local devices; on an abstract mesh, the devices whose
  // coordinates are all 0 or 1, among which is the most loaded): peak bytes and collective
  // bytes, so sums over a real mesh's devices compare with CommDebugMode's.
  std::vector<int64_t> device_ids, device_peak_bytes, device_collective_bytes, output_bytes_per_device;

  struct Collective {
    std::string kind;        // "all_reduce", ...
    std::string mesh_dim;
    int64_t group_size = 0;
    bool within_node = true;  // the intra-node link; else the inter-node one
    int64_t calls = 0;
    int64_t bytes = 0;       // received by the most loaded device, all calls together
    double seconds = 0;
  };
  std::vector<Collective> collectives;  // one per (kind, mesh dim), in first-use order

  struct Part {
    std::string name;        // an op kind ("kernel", "gemm", "attention", "all_gather", ...) or a module path
    int64_t steps = 0;
    double flops = 0;
    int64_t bytes = 0;       // touched by kernels and library calls; received by collectives
    double seconds = 0;
  };
  std::vector<Part> by_op_kind, by_module;
  // The slowest device's steps in the order the executor runs them (one per scheduled step,
  // as the executable's profile numbers them): op kind, FLOPs, bytes, predicted time.
  std::vector<Part> steps;

  std::string to_string() const;  // a text table
  std::string to_json() const;
};

// The report of `plan` on `hardware`.
PlanReport plan_report(const ProgramPlan& plan, const Hardware& hardware);

// The hardware a program on `mesh` is predicted on: an abstract mesh's own; for real CPU meshes
// this machine's, as shared by the mesh's local devices (this_machine_device); the H100 SXM
// profile for real GPU meshes (until a GPU calibration exists).
Hardware planning_hardware(const Mesh& mesh);

}  // namespace tessera
