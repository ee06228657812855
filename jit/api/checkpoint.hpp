// Sharded checkpoints. save() writes every unique shard once (by the lowest device holding it)
// into safetensors files, one per device (named by its client and its index there), plus
// index.json (nlohmann-json): each variable's global shape, dtype and layout, and each chunk's
// file, offset, shape and xxh64 checksum. Saving is atomic: data files get fresh names, each file
// is written to a fresh temporary name (jit/api/checkpoint_files.hpp), fsync'ed and renamed, and the
// index is renamed last; a save killed midway leaves the previous checkpoint loadable, and a save
// that fails on any client removes every file it wrote. load() reads regular files only, never
// blocking, and reshards: each device reads the saved chunks that intersect its block in the
// variable's current layout, so any mesh and layout can load any checkpoint.
#pragma once

#include <map>
#include <string>

#include "dsl/variable.hpp"

namespace tessera {

// IOError naming the file when a file cannot be written (on every client alike, under mpirun).
void save(const std::string& dir, const std::map<std::string, Variable>& vars);
// IOError naming the variable for a missing entry, mismatched shape or dtype, or corrupt data.
void load(const std::string& dir, std::map<std::string, Variable>& vars);

}  // namespace tessera
