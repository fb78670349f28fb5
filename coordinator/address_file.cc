#include "coordinator/address_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "coordinator/proto_json.h"
#include "google/protobuf/struct.pb.h"

namespace onebit {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status WriteAddressFile(const std::string& path, const CoordinatorAddresses& addresses) {
  google::protobuf::Struct json;
  (*json.mutable_fields())["grpc"].set_string_value(addresses.grpc);
  (*json.mutable_fields())["rest"].set_string_value(addresses.rest);
  (*json.mutable_fields())["metrics"].set_string_value(addresses.metrics);
  const std::string text = ToJson(json) + "\n";
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", temp);
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool synced = written && fsync(fd) == 0;
  close(fd);
  if (!synced) {
    absl::Status status = Errno("cannot write", temp);
    unlink(temp.c_str());
    return status;
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status status = Errno("cannot rename to", path);
    unlink(temp.c_str());
    return status;
  }
  return absl::OkStatus();
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
