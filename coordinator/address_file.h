// Where a running coordinator listens, as a small JSON file a launcher (or a test) can wait
// for: {"grpc": "127.0.0.1:40123", "rest": "127.0.0.1:40124", "metrics": "127.0.0.1:40125"}.
// Written atomically (a temporary file in the same directory, fsync, rename), so a reader
// sees either no file or a whole one.
#ifndef ONEBIT_COORDINATOR_ADDRESS_FILE_H_
#define ONEBIT_COORDINATOR_ADDRESS_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onebit {

struct CoordinatorAddresses {
  std::string grpc;     // host:port
  std::string rest;     // host:port
  std::string metrics;  // host:port, empty if not served
};

absl::Status WriteAddressFile(const std::string& path, const CoordinatorAddresses& addresses);
// NOT_FOUND if the file does not exist (yet); INVALID_ARGUMENT if it is not such a file.
absl::StatusOr<CoordinatorAddresses> ReadAddressFile(const std::string& path);

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_ADDRESS_FILE_H_
