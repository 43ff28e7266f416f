#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/file_descriptor.h"

namespace peerserve {
namespace {

Status open_failure(const std::filesystem::path& path, int err) {
  const std::string message = path.string() + ": cannot open: " + std::strerror(err);
  return err == ENOENT ? not_found(message) : io_error(message);
}

Status not_regular(const std::filesystem::path& path, mode_t mode) {
  const char* kind = S_ISDIR(mode)                    ? "a directory"
                     : S_ISFIFO(mode)                 ? "a FIFO"
                     : S_ISSOCK(mode)                 ? "a socket"
                     : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
                                                      : "not a regular file";
  return invalid_argument(path.string() + ": " + kind + ", expected a regular file");
}

}  // namespace

Result<std::string> read_regular_file(const std::filesystem::path& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO returns at once (and is refused below) instead of waiting for
  // a writer; it changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return open_failure(path, errno);
  const FileDescriptor file(fd);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) {
    return io_error(path.string() + ": cannot stat: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return invalid_argument(path.string() + ": " + std::to_string(size) + " bytes, more than the " +
                            std::to_string(max_bytes) + " such a file may have");
  }
  // Read to the end, not to st_size: a file of /proc says 0 bytes and has more (it read as
  // empty); one that grows past max_bytes while read is refused like a larger one.
  const auto too_large = [&] {
    return invalid_argument(path.string() + ": more than the " + std::to_string(max_bytes) +
                            " bytes such a file may have");
  };
  std::string text(static_cast<size_t>(std::max<uint64_t>(size, 1) + 1), '\0');
  size_t done = 0;
  for (;;) {
    if (done == text.size()) {
      if (done > max_bytes) return too_large();
      // One byte past max_bytes tells a larger file (max_bytes is never near 2^64 here: a
      // string that size cannot be allocated anyway).
      const uint64_t past = max_bytes < UINT64_MAX ? max_bytes + 1 : max_bytes;
      text.resize(static_cast<size_t>(std::min<uint64_t>(2 * done, past)));
    }
    const ssize_t got = ::read(file.get(), text.data() + done, text.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return io_error(path.string() + ": read failed: " + std::strerror(errno));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  if (done > max_bytes) return too_large();
  text.resize(done);
  return text;
}

Status require_directory(const std::filesystem::path& dir, const std::string& what) {
  std::error_code error;
  if (std::filesystem::is_directory(dir, error)) return ok_status();
  const bool exists = std::filesystem::exists(dir, error);
  return not_found(dir.string() + (exists ? ": not a directory (" : ": no such directory (") +
                   what + ")");
}

Result<TextPrefix> read_text_file_or_pipe(const std::filesystem::path& path,
                                          const std::string& what, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string message = what + ": " + std::strerror(err);
    return err == ENOENT ? not_found(message) : io_error(message);
  }
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return invalid_argument(what +
                            ": expected a file or a pipe (a directory or a device is "
                            "neither)");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a pipe waits for its writer
  if (fd < 0) return io_error(what + ": cannot open: " + std::strerror(errno));
  const FileDescriptor file(fd);
  // In pieces: the buffer grows with the text, not with max_bytes.
  TextPrefix prefix;
  char piece[1 << 16];
  for (;;) {
    const uint64_t room = max_bytes - prefix.text.size();
    const size_t want = room < sizeof piece ? static_cast<size_t>(room) + 1 : sizeof piece;
    const ssize_t got = ::read(file.get(), piece, want);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return io_error(what + ": read failed: " + std::strerror(errno));
    if (got == 0) break;
    const size_t n = static_cast<size_t>(got);
    if (n > room) {  // one byte past the limit: the text goes on
      prefix.text.append(piece, static_cast<size_t>(room));
      prefix.more = true;
      break;
    }
    prefix.text.append(piece, n);
  }
  return prefix;
}

}  // namespace peerserve
