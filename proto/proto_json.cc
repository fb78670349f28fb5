#include "proto/proto_json.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace onebit {

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.add_whitespace = pretty;
  std::string json;
  // Printing a well-formed message cannot fail (NaN and infinities print as strings).
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

absl::Status FromJson(absl::string_view json, google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  message->Clear();
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), message, options);
  if (!status.ok()) {
    message->Clear();
    return absl::InvalidArgumentError(absl::StrCat("malformed JSON for ",
                                                   message->GetDescriptor()->full_name(), ": ",
                                                   status.message().as_string()));
  }
  return absl::OkStatus();
}

}  // namespace onebit
