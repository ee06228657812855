// The disk cache of compiled kernels, shared by every KernelCompiler. Entries live under
// compile_cache_dir(), keyed by an xxh3-128 hash of the compiler's identity and the kernels'
// IR text; files are written under a temporary name and renamed, carry a checksum, and a
// corrupt one is removed and recompiled (an unwritable cache only costs recompilation). With
// the cache off, every get() compiles.
//
// Entries are native code, checked for integrity only, so the cache trusts only what this user
// alone could have written (as ssh does its keys): it makes its folders 0700 and entries 0600;
// a cache folder owned by another user or writable by group or others is not used at all (one
// warning), and an entry that is a symbolic link, not a regular file, another user's, or
// writable by group or others is not loaded (a warning) but removed and compiled afresh.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "jit/kernel_compiler.hpp"

namespace tessera {

struct CachedArtifact {
  std::string key;    // 32 hex digits
  std::string bytes;  // the compiler's artifact
  bool compiled = false;  // false: read from the disk
  double compile_ms = 0;
};

class CompileCache {
 public:
  // `extension` tells artifacts of different compilers apart on disk (".o", ".cubin").
  explicit CompileCache(std::string extension) : extension_(std::move(extension)) {}

  // The key of `kernels` under `compiler` (names of entry points derive from it).
  static std::string key_of(const KernelCompiler& compiler, const std::vector<kir::Kernel>& kernels);
  // The key of one kernel whose text (kir::Kernel::to_string) is `kernel_text`: key_of({kernel}).
  static std::string key_of_text(const KernelCompiler& compiler, std::string_view kernel_text);
  // The key of a source written by hand (a backend's library kernels) under `compiler`.
  static std::string key_of_source(const KernelCompiler& compiler, std::string_view source);
  // The artifact for `key`: from the disk, else compiled by `compile` and stored.
  template <class Compile>
  CachedArtifact get(const std::string& key, Compile&& compile) {
    CachedArtifact out{key, read(key), false, 0};
    if (!out.bytes.empty()) return out;
    const auto start = now_ms();
    out.bytes = compile();
    out.compile_ms = now_ms() - start;
    out.compiled = true;
    write(key, out.bytes);
    return out;
  }
  // For artifacts kept only when they are worth keeping: the stored one ("" when absent), and
  // storing one.
  std::string find(const std::string& key) const { return read(key); }
  void store(const std::string& key, const std::string& bytes) const { write(key, bytes); }

 private:
  static double now_ms();
  std::string path(const std::string& dir, const std::string& key) const;
  std::string read(const std::string& key) const;  // "" when absent, corrupt or the cache is off
  void write(const std::string& key, const std::string& bytes) const;  // nothing when the cache is off

  std::string extension_;
};

// $TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else ~/.cache/tessera; "" when the disk
// cache is off: TESSERA_CACHE_DIR set to "", "off", "none" or "0" (silently), or to a relative
// path (with one warning per value). Read on every call.
std::string compile_cache_dir();

}  // namespace tessera
