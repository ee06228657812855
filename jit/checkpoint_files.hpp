// The files of a checkpoint on disk. Reading treats them as untrusted input: only regular files
// are read, and nothing blocks (a FIFO or a device planted in the folder is an IOError, not a
// hang or an endless read). Writing goes through fresh temporary names (jit/private_files.hpp),
// never through a name someone else could have planted.
#pragma once

#include <filesystem>
#include <string>

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

}  // namespace tessera
