// Where a test finds what Bazel gives it: the binaries among its runfiles (its `data`),
// its private temporary directory, and a free loopback port.
#ifndef ONEBIT_TESTS_TEST_PATHS_H_
#define ONEBIT_TESTS_TEST_PATHS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace onebit::testing_paths {

// The environment variable `name`, or `fallback` when unset.
inline std::string Env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// The runfiles root of this workspace: binaries are at RunfilesRoot() + "/server/...".
inline std::string RunfilesRoot() {
  return absl::StrCat(Env("TEST_SRCDIR"), "/", Env("TEST_WORKSPACE", "onebit"));
}

// `path` (relative to the workspace) among the runfiles.
inline std::string Runfile(const std::string& path) { return absl::StrCat(RunfilesRoot(), "/", path); }

inline std::string TestTmpDir() { return Env("TEST_TMPDIR", "/tmp"); }

// A loopback port that was free a moment ago (for programs that take a listen address as
// a flag, such as Prometheus); 0 if none could be had.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

}  // namespace onebit::testing_paths

#endif  // ONEBIT_TESTS_TEST_PATHS_H_
