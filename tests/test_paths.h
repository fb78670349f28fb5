// Where a test finds what Bazel gives it: the binaries among its runfiles (its `data`),
// and its private temporary directory.
#ifndef ONEBIT_TESTS_TEST_PATHS_H_
#define ONEBIT_TESTS_TEST_PATHS_H_

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

}  // namespace onebit::testing_paths

#endif  // ONEBIT_TESTS_TEST_PATHS_H_
