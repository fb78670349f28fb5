#include "coordinator/address_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "proto/proto_json.h"
#include "google/protobuf/struct.pb.h"

namespace onebit {

absl::Status WriteAddressFile(const std::string& path, const CoordinatorAddresses& addresses) {
  google::protobuf::Struct json;
  (*json.mutable_fields())["grpc"].set_string_value(addresses.grpc);
  (*json.mutable_fields())["rest"].set_string_value(addresses.rest);
  (*json.mutable_fields())["metrics"].set_string_value(addresses.metrics);
  return WriteFileAtomically(path, ToJson(json) + "\n");
}

absl::StatusOr<CoordinatorAddresses> ReadAddressFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no address file ", path));
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct json;
  absl::Status status = FromJson(text.str(), &json);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.message()));
  }
  CoordinatorAddresses addresses;
  for (auto [key, field] : {std::pair<const char*, std::string*>{"grpc", &addresses.grpc},
                            {"rest", &addresses.rest},
                            {"metrics", &addresses.metrics}}) {
    auto it = json.fields().find(key);
    if (it == json.fields().end() ||
        it->second.kind_case() != google::protobuf::Value::kStringValue) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no string \"", key, "\""));
    }
    *field = it->second.string_value();
  }
  return addresses;
}

}  // namespace onebit
