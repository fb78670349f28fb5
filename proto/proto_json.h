// protobuf's JSON mapping, configured once for everything that speaks JSON about the job
// (the REST mirror, onebitctl --json, tests): field names in lowerCamelCase, every field
// printed (zeros and empty strings too, so a reader never has to know proto3 defaults),
// enums by name, 64-bit integers as strings. Parsing accepts lowerCamelCase and the proto
// field names, and rejects unknown fields.
#ifndef ONEBIT_PROTO_PROTO_JSON_H_
#define ONEBIT_PROTO_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace onebit {

// One line of JSON; `pretty` adds newlines and indentation.
std::string ToJson(const google::protobuf::Message& message, bool pretty = false);

// Replaces `message` with the parsed JSON. INVALID_ARGUMENT saying what is wrong.
absl::Status FromJson(absl::string_view json, google::protobuf::Message* message);

}  // namespace onebit

#endif  // ONEBIT_PROTO_PROTO_JSON_H_
