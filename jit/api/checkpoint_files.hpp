// The files of a checkpoint on disk. Reading treats them as untrusted input: only regular files
// are read, and nothing blocks (a FIFO or a device planted in the folder is an IOError, not a
// hang or an endless read). Writing goes through fresh temporary names (jit/private_files.hpp),
// never through a name someone else could have planted, and a save that fails removes every
// file it wrote.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tessera {

// The bytes of the regular file `path` (a symbolic link to one is followed); `what` says what it
// is for ("index", "variable 'w'"). IOError naming the file when it is missing or unreadable, or
// what it is instead of a regular file ("is a directory, not a regular file").
std::string read_checkpoint_file(const std::filesystem::path& path, const std::string& what);

// Writes `bytes` to `path` durably: a fresh temporary beside it, fsync, rename over `path`.
// IOError naming the file on failure, with the temporary removed.
void write_checkpoint_file(const std::filesystem::path& path, const std::string& bytes);

// fsync of a folder, so the renames into it last.
void sync_directory(const std::filesystem::path& dir);

// The data files one save writes into its folder. Until keep() (once an index refers to them),
// destroying the set removes every file it wrote: a failed save leaves nothing of its own
// behind, only the previous checkpoint.
class CheckpointFilesWritten {
 public:
  explicit CheckpointFilesWritten(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~CheckpointFilesWritten();
  CheckpointFilesWritten(const CheckpointFilesWritten&) = delete;
  CheckpointFilesWritten& operator=(const CheckpointFilesWritten&) = delete;

  // write_checkpoint_file into the folder, remembering the file.
  void write(const std::string& name, const std::string& bytes);
  void keep() { written_.clear(); }

 private:
  std::filesystem::path dir_;
  std::vector<std::filesystem::path> written_;
};

}  // namespace tessera
