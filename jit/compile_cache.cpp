#include "jit/compile_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "dsl/logging.hpp"
#include "jit/private_files.hpp"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'O', 'B', 'J', '0', '1'};

// Warnings about a setting or a folder are given once per process, however often it is used.
void warn_once(const std::string& what, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (warned.insert(what).second) component_logger("jit").warn("{}", message);
}

// The cache holds native code that is loaded and run, checked for integrity only: like ssh with
// its keys, it is used only from a folder no one but this user can write. False when `dir` is
// missing (and not `create`d), unusable or not private (one warning).
bool trusted_dir(const std::string& dir, bool create) {
  if (create && !make_private_dirs(dir)) return false;  // an unwritable cache only costs recompiling
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return false;
  std::string why = S_ISDIR(st.st_mode) ? not_private(st) : "is not a directory";
  if (why.empty()) return true;
  warn_once(dir, fmt::format("compile cache directory {} {}; the disk cache is off (it holds native code: give it to "
                             "this user with mode 0700, or set TESSERA_CACHE_DIR)",
                             dir, why));
  return false;
}

bool read_exact(int fd, void* into, size_t bytes) {
  auto* at = static_cast<char*>(into);
  while (bytes > 0) {
    const ssize_t got = ::read(fd, at, bytes);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    at += got;
    bytes -= size_t(got);
  }
  return true;
}

// 32 hex digits of the xxh3-128 hash of `text`.
std::string hex_key(std::string_view text) {
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

}  // namespace

std::string CompileCache::key_of(const KernelCompiler& compiler, const std::vector<kir::Kernel>& kernels) {
  std::string text = compiler.identity() + "\n";
  for (const auto& k : kernels) text += k.to_string() + "\n";
  return hex_key(text);
}

std::string CompileCache::key_of_text(const KernelCompiler& compiler, std::string_view kernel_text) {
  return hex_key(compiler.identity() + "\n" + std::string(kernel_text) + "\n");
}

std::string CompileCache::key_of_source(const KernelCompiler& compiler, std::string_view source) {
  return hex_key(compiler.identity() + "\nsource\n" + std::string(source));
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
  if (dir.empty() || !trusted_dir(dir, false)) return {};
  const std::string file = path(dir, key);
  struct stat st;
  if (::lstat(file.c_str(), &st) != 0) return {};  // not cached yet
  // The directory is ours alone (trusted_dir), so removing what is in it is safe; a fresh entry
  // replaces it after compiling.
  auto skip = [&](const std::string& why) {
    component_logger("jit").warn("compile cache entry {} {}; not loading it, recompiling", file, why);
    ::unlink(file.c_str());
    return std::string();
  };
  if (S_ISLNK(st.st_mode)) return skip("is a symbolic link");
  if (!S_ISREG(st.st_mode)) return skip("is not a regular file");
  if (const std::string why = not_private(st); !why.empty()) return skip(why);
  const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return {};
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat opened;
  if (::fstat(fd, &opened) != 0 || opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) return {};  // replaced meanwhile
  auto corrupt = [&] {
    component_logger("jit").warn("compile cache entry {} is corrupt; recompiling", file);
    ::unlink(file.c_str());
    return std::string();
  };
  char magic[8];
  uint64_t checksum = 0, size = 0;
  if (!read_exact(fd, magic, 8) || !read_exact(fd, &checksum, 8) || !read_exact(fd, &size, 8) ||
      std::memcmp(magic, kMagic, 8) != 0 || size == 0 || size > (uint64_t(1) << 32))
    return corrupt();
  std::string data(size, '\0');
  if (!read_exact(fd, data.data(), size) || XXH3_64bits(data.data(), data.size()) != checksum) return corrupt();
  return data;
}

void CompileCache::write(const std::string& key, const std::string& bytes) const {
  const std::string dir = compile_cache_dir();
  if (dir.empty() || !trusted_dir(dir, true)) return;
  const std::string file = path(dir, key);
  // A fresh name no one else made (mode 0600), renamed over any old entry, never written in place.
  std::string tmp;
  const int fd = create_fresh_file(file, 0600, tmp);
  if (fd < 0) return;
  const uint64_t checksum = XXH3_64bits(bytes.data(), bytes.size()), size = bytes.size();
  const bool written = write_all(fd, kMagic, 8) && write_all(fd, &checksum, 8) && write_all(fd, &size, 8) &&
                       write_all(fd, bytes.data(), size);
  if (::close(fd) != 0 || !written || ::rename(tmp.c_str(), file.c_str()) != 0) ::unlink(tmp.c_str());
}

std::string compile_cache_dir() {
  if (const char* setting = std::getenv("TESSERA_CACHE_DIR")) {
    const std::string dir(setting);
    if (dir.empty() || dir == "off" || dir == "none" || dir == "0") return {};
    // A relative path would put the cache wherever the process happens to start (it once
    // committed cache objects to the repository as none/): refused rather than guessed.
    if (dir.front() != '/') {
      warn_once("TESSERA_CACHE_DIR=" + dir, fmt::format("TESSERA_CACHE_DIR={} is a relative path; the compile cache is off "
                                                       "(give an absolute path, or off to turn it off)",
                                                       dir));
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
