#include "jit/api/checkpoint_files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "dsl/error.hpp"
#include "jit/private_files.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

struct ClosesFile {
  int fd;
  ~ClosesFile() { ::close(fd); }
};

}  // namespace

std::string read_checkpoint_file(const fs::path& path, const std::string& what) {
  const std::string where = "checkpoint " + what + ": '" + path.string() + "'";
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever. The type is checked
  // on the open file itself, so it cannot be swapped between the check and the read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw IOError(fmt::format("checkpoint {}: cannot read '{}': {}", what, path.string(), std::strerror(errno)));
  const ClosesFile closes{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) throw IOError(fmt::format("{}: cannot stat it: {}", where, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw IOError(fmt::format("{} is {}, not a regular file", where, file_kind(st.st_mode)));
  std::string bytes;
  try {
    bytes.resize(size_t(st.st_size));
  } catch (const std::bad_alloc&) {
    throw IOError(fmt::format("{} is too large to read ({} bytes)", where, st.st_size));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw IOError(fmt::format("{}: reading failed: {}", where, std::strerror(errno)));
    if (got == 0) break;  // shrunk meanwhile: the checks on its contents find it truncated
    done += size_t(got);
  }
  bytes.resize(done);
  return bytes;
}

void write_checkpoint_file(const fs::path& path, const std::string& bytes) {
  std::string tmp;
  const int fd = create_fresh_file(path.string(), 0644, tmp);
  if (fd < 0) throw IOError(fmt::format("cannot create a temporary for checkpoint file '{}': {}", path.string(), std::strerror(errno)));
  // A failed write (a full disk) leaves no temporary behind.
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw IOError(fmt::format("{} checkpoint file '{}' failed: {}", what, tmp, reason));
  };
  if (!write_all(fd, bytes.data(), bytes.size())) fail("writing");
  if (::fsync(fd) != 0) fail("syncing");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw IOError(fmt::format("cannot move checkpoint file into place as '{}': {}", path.string(), reason));
  }
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

CheckpointFilesWritten::~CheckpointFilesWritten() {
  for (const fs::path& file : written_) ::unlink(file.c_str());
  if (!written_.empty()) sync_directory(dir_);
}

void CheckpointFilesWritten::write(const std::string& name, const std::string& bytes) {
  const fs::path path = dir_ / name;
  write_checkpoint_file(path, bytes);
  written_.push_back(path);
}

}  // namespace tessera
