// Writing a whole file so that a reader (another process polling for it, or anyone after a
// crash) sees either the old file, or no file, or the complete new one; never a prefix.
//
// How: a new temporary file with a unique name in the destination's directory (so the
// rename stays on one file system and is atomic), every byte written, fsync, rename over
// the destination, then a best-effort fsync of the directory so the rename itself survives
// a crash. On any failure the temporary file is removed and the destination is untouched.
// The new file gets the usual umask-derived permissions (0666 & ~umask), as open() would
// give it.
//
// Errors name the destination path and carry strerror; the code follows errno
// (absl::ErrnoToStatus: NOT_FOUND for a missing directory, PERMISSION_DENIED, ...).
//
// Thread safety: thread safe. Concurrent writers of the same path each replace the file
// whole; the last rename wins.
#ifndef ONEBIT_COMMON_ATOMIC_FILE_H_
#define ONEBIT_COMMON_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace onebit {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// The same, with the contents given as pieces written one after another: for callers
// whose data is too large to copy into one string first (a header and a big array).
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> pieces);

}  // namespace onebit

#endif  // ONEBIT_COMMON_ATOMIC_FILE_H_
