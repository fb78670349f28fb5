// absl::Status <-> grpc::Status, for every gRPC service and client of the project. The codes are the same numbers, so the conversion is
// one-to-one and loses nothing but error details (which we do not use).
#ifndef ONEBIT_PROTO_GRPC_STATUS_H_
#define ONEBIT_PROTO_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace onebit {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace onebit

#endif  // ONEBIT_PROTO_GRPC_STATUS_H_
