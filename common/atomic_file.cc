#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace onebit {
namespace {

absl::Status ErrnoError(int err, const std::string& path, absl::string_view what) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", what));
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteFully(int fd, const std::string& path, const std::string& tmp,
                        absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, absl::StrCat("cannot write ", tmp));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  return WriteFileAtomically(path, absl::MakeConstSpan(&contents, 1));
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> pieces) {
  // pid and a counter make the name unique among this process's threads and other
  // processes; O_EXCL makes sure, and a stale file of a crashed process is skipped. Not
  // mkstemp: its 0600 would leave the file unreadable to the other users a umask allows.
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) {
      return ErrnoError(errno, path, absl::StrCat("cannot create temporary file ", tmp));
    }
  }
  auto fail = [&](absl::Status status) {
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    return status;
  };
  for (absl::string_view piece : pieces) {
    absl::Status written = WriteFully(fd, path, tmp, piece);
    if (!written.ok()) return fail(written);
  }
  if (fsync(fd) != 0) return fail(ErrnoError(errno, path, absl::StrCat("cannot fsync ", tmp)));
  const int closed = close(fd);
  fd = -1;
  if (closed != 0) return fail(ErrnoError(errno, path, absl::StrCat("cannot close ", tmp)));
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(ErrnoError(errno, path, absl::StrCat("cannot rename ", tmp, " to it")));
  }
  // Best effort: the data is in place already, and some file systems refuse fsync on a
  // directory; without it a crash could only bring back the old file, never a partial one.
  const int dir_fd = open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace onebit
