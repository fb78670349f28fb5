#include "coordinator/kv_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace onebit {
namespace {

// Keys go into error messages: printable and short.
std::string Quote(const std::string& key) {
  constexpr size_t kShown = 80;
  std::string shown = absl::CHexEscape(key.substr(0, kShown));
  return absl::StrCat("'", shown, key.size() > kShown ? "...'" : "'");
}

}  // namespace

absl::Status KvStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key is ", key.size(), " bytes; the limit is ", limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status KvStore::Set(const std::string& key, const std::string& value) {
  absl::Status status = CheckKey(key);
  if (!status.ok()) return status;
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of key ", Quote(key), " is ",
                                                   value.size(), " bytes; the limit is ",
                                                   limits_.max_value_bytes));
  }
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    if (it->second == value) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat(
        "key ", Quote(key), " is already set to another value; keys are written once"));
  }
  if (map_.size() >= limits_.max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds its limit of ", limits_.max_keys, " keys"));
  }
  const size_t bytes = key.size() + value.size();
  if (total_bytes_ + bytes > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store would exceed its limit of ", limits_.max_total_bytes, " bytes"));
  }
  map_.emplace(key, value);
  total_bytes_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> KvStore::Get(const std::string& key,
                                                        absl::Duration wait) {
  absl::Status status = CheckKey(key);
  if (!status.ok()) return status;
  const absl::Duration bounded = std::min(wait, limits_.max_wait);
  absl::MutexLock lock(&mu_);
  if (bounded > absl::ZeroDuration()) {
    auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shut_down_ || map_.contains(key);
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), bounded);
    if (!map_.contains(key)) {
      if (shut_down_) return absl::UnavailableError("the coordinator is shutting down");
      return absl::DeadlineExceededError(
          absl::StrCat("key ", Quote(key), " was not set within ", absl::FormatDuration(bounded)));
    }
  }
  auto it = map_.find(key);
  if (it == map_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

void KvStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

size_t KvStore::size() const {
  absl::MutexLock lock(&mu_);
  return map_.size();
}

}  // namespace onebit
