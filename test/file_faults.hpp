// Faults in writing files, for the checkpoint tests (test_training, test_mpi): a disk that fills
// up at a given size, and what a folder holds afterwards.
#pragma once

#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace tessera::testing {

// Every entry of a folder by name, with its contents ("(a folder)" for a folder).
inline std::map<std::string, std::string> folder_contents(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(f.path(), std::ios::binary);
    out[f.path().filename().string()] =
        std::filesystem::is_directory(f.path()) ? "(a folder)" : std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

// While it lives, files this process writes cannot grow past `bytes` (RLIMIT_FSIZE: writing
// further is EFBIG, SIGXFSZ ignored meanwhile), as on a disk that fills up at that point.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) : handler_(std::signal(SIGXFSZ, SIG_IGN)) {
    getrlimit(RLIMIT_FSIZE, &before_);
    const rlimit limited{bytes, before_.rlim_max};
    setrlimit(RLIMIT_FSIZE, &limited);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &before_);
    std::signal(SIGXFSZ, handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit before_{};
  void (*handler_)(int);
};

}  // namespace tessera::testing
