#include "base/file_sync.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "base/file_descriptor.h"

namespace peerserve {
namespace fs = std::filesystem;

Status sync_path(const fs::path& path) {
  std::error_code ec;
  const bool is_folder = fs::is_directory(fs::symlink_status(path, ec));
  const int flags = O_RDONLY | O_CLOEXEC | (is_folder ? O_DIRECTORY : 0);
  const FileDescriptor fd(::open(path.c_str(), flags));
  if (!fd.valid() || ::fsync(fd.get()) != 0) {
    return io_error("cannot sync " + path.string() + " to disk: " + std::strerror(errno));
  }
  return ok_status();
}

Status sync_tree(const fs::path& dir) {
  constexpr int kMaxDepth = 64;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec);
  if (ec) return io_error("cannot list " + dir.string() + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return io_error("cannot list " + dir.string() + ": " + ec.message());
    if (it.depth() >= kMaxDepth) {
      return io_error(dir.string() + ": folders nested deeper than " + std::to_string(kMaxDepth) +
                      " levels");
    }
    const fs::file_status status = it->symlink_status(ec);
    if (ec) return io_error("cannot read " + it->path().string() + ": " + ec.message());
    if (fs::is_regular_file(status) || fs::is_directory(status)) {
      PS_RETURN_IF_ERROR(sync_path(it->path()));
    }
  }
  if (ec) return io_error("cannot list " + dir.string() + ": " + ec.message());
  return sync_path(dir);
}

}  // namespace peerserve
