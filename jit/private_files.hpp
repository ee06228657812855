// Files only this user can have written, for data that is run as code (the compile cache's
// objects) or read back as state (checkpoints). As ssh treats its keys: a folder or file owned by
// another user, or writable by group or others, is not trusted; folders made here are 0700. New
// files are made under fresh names, never opened through a name someone else could have planted.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <string>

namespace tessera {

// Creates the absolute path `dir` and its missing parents with mode 0700 (whatever the umask);
// false when one cannot be made. Existing folders are left as they are.
bool make_private_dirs(const std::string& dir);

// Why the file or folder `st` describes is not private to this user ("is owned by uid 5, not by
// this user (uid 0)", "is writable by group or others (mode 0777)"); "" when it is.
std::string not_private(const struct stat& st);

// Creates and opens for writing a new file beside `path`, named "<path>.<16 random hex>.tmp",
// with O_CREAT | O_EXCL | O_NOFOLLOW: a file or link another user planted in the folder is never
// opened, so writing cannot be redirected to a file of theirs choosing. `mode` as open(2)'s (the
// umask applies). Returns the descriptor (close-on-exec) and sets `created` to the name; -1 with
// errno set when no file could be made.
int create_fresh_file(const std::string& path, mode_t mode, std::string& created);

// Writes all `bytes` to `fd`, through short writes and interruptions; false (errno set) when the
// file takes no more (a full disk).
bool write_all(int fd, const void* from, size_t bytes);

}  // namespace tessera
