#include "jit/compile_cache.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "dsl/logging.hpp"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'O', 'B', 'J', '0', '1'};

}  // namespace

std::string CompileCache::key_of(const KernelCompiler& compiler, const std::vector<kir::Kernel>& kernels) {
  std::string text = compiler.identity() + "\n";
  for (const auto& k : kernels) text += k.to_string() + "\n";
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

double CompileCache::now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string CompileCache::path(const std::string& dir, const std::string& key) const {
  return dir + "/" + key + extension_;
}

// [magic 8][xxh3-64 of the artifact 8][size 8][artifact]
std::string CompileCache::read(const std::string& key) const {
  const std::string dir = compile_cache_dir();
  if (dir.empty()) return {};
  const std::string file = path(dir, key);
  std::ifstream in(file, std::ios::binary);
  if (!in) return {};
  auto corrupt = [&] {
    component_logger("jit").warn("compile cache entry {} is corrupt; recompiling", file);
    std::error_code ec;
    std::filesystem::remove(file, ec);
    return std::string();
  };
  char magic[8];
  uint64_t checksum = 0, size = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&checksum), 8);
  in.read(reinterpret_cast<char*>(&size), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0 || size == 0 || size > (uint64_t(1) << 32)) return corrupt();
  std::string data(size, '\0');
  in.read(data.data(), std::streamsize(size));
  if (!in || XXH3_64bits(data.data(), data.size()) != checksum) return corrupt();
  return data;
}

void CompileCache::write(const std::string& key, const std::string& bytes) const {
  const std::string dir = compile_cache_dir();
  if (dir.empty()) return;
  const std::string file = path(dir, key);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  if (ec) return;
  const std::string tmp = file + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const uint64_t checksum = XXH3_64bits(bytes.data(), bytes.size()), size = bytes.size();
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&checksum), 8);
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(bytes.data(), std::streamsize(size));
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

std::string compile_cache_dir() {
  if (const char* setting = std::getenv("TESSERA_CACHE_DIR")) {
    const std::string dir(setting);
    if (dir.empty() || dir == "off" || dir == "none" || dir == "0") return {};
    // A relative path would put the cache wherever the process happens to start (it once
    // committed cache objects to the repository as none/): refused rather than guessed.
    if (dir.front() != '/') {
      static std::mutex mutex;
      static std::set<std::string> warned;
      std::lock_guard lock(mutex);
      if (warned.insert(dir).second)
        component_logger("jit").warn(
            "TESSERA_CACHE_DIR={} is a relative path; the compile cache is off (give an absolute path, or "
            "off to turn it off)",
            dir);
      return {};
    }
    return dir;
  }
  // The XDG base-directory spec: a relative XDG_CACHE_HOME is invalid and ignored.
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg == '/') return std::string(xdg) + "/tessera";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/tessera";
  return "/tmp/tessera-cache";
}

}  // namespace tessera
