// absl::Status <-> grpc::Status. Abseil's codes are gRPC's codes, so the mapping is
// one-to-one and keeps the message.
#ifndef ONEBIT_SERVER_GRPC_STATUS_H_
#define ONEBIT_SERVER_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace onebit::server {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_GRPC_STATUS_H_
