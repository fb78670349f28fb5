#include "common/permanent_error.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace onebit {
namespace {

constexpr absl::string_view kPermanentUrl = "type.onebit/permanent";

}  // namespace

absl::Status MarkPermanent(absl::Status status, int64_t step) {
  if (!status.ok()) status.SetPayload(kPermanentUrl, absl::Cord(absl::StrCat(step)));
  return status;
}

bool IsPermanent(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kPermanentUrl).has_value();
}

int64_t PermanentErrorStep(const absl::Status& status) {
  if (status.ok()) return 0;
  const auto payload = status.GetPayload(kPermanentUrl);  // absl::optional here
  int64_t step = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &step)) return 0;
  return step;
}

}  // namespace onebit
