#include "worker/transport/coordinator_gloo_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"

namespace onebit {
namespace {

// One waiting KvGet asks for at most this long; longer waits take several calls, so that
// no call runs into the coordinator's own bound or a proxy's idle timeout.
constexpr absl::Duration kLongPoll = absl::Seconds(10);

}  // namespace

std::string GlooStorePrefix(const std::string& job_id, int64_t generation) {
  return absl::StrCat("gloo/", job_id, "/", generation, "/");
}

CoordinatorGlooStore::CoordinatorGlooStore(std::shared_ptr<CoordinatorClient> client,
                                           std::string prefix, std::chrono::milliseconds timeout)
    : client_(std::move(client)), prefix_(std::move(prefix)), timeout_(timeout) {}

void CoordinatorGlooStore::set(const std::string& key, const std::vector<char>& data) {
  v1::KvSetRequest request;
  request.set_key(prefix_ + key);
  request.set_value(std::string(data.begin(), data.end()));
  absl::StatusOr<v1::KvSetResponse> response = client_->KvSet(request);
  if (!response.ok()) {
    throw gloo::IoException(absl::StrCat("coordinator store: set '", request.key(),
                                         "': ", response.status().ToString()));
  }
}

std::string CoordinatorGlooStore::WaitFor(const std::string& key,
                                          std::chrono::milliseconds timeout) {
  const bool forever = timeout == gloo::kNoTimeout;
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  v1::KvGetRequest request;
  request.set_key(prefix_ + key);
  request.set_wait(true);
  while (true) {
    const absl::Duration left = forever ? kLongPoll : deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    request.set_timeout_ms(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(std::min(left, kLongPoll))));
    absl::StatusOr<v1::KvGetResponse> response = client_->KvGet(request);
    if (response.ok() && response->found()) return response->value();
    if (!response.ok() && response.status().code() != absl::StatusCode::kDeadlineExceeded) {
      throw gloo::IoException(absl::StrCat("coordinator store: get '", request.key(),
                                           "': ", response.status().ToString()));
    }
  }
  throw gloo::IoException(absl::StrCat("coordinator store: Wait timeout for key(s): ",
                                       request.key(), " after ", timeout.count(), " ms"));
}

std::vector<char> CoordinatorGlooStore::get(const std::string& key) {
  const std::string value = WaitFor(key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void CoordinatorGlooStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void CoordinatorGlooStore::wait(const std::vector<std::string>& keys,
                                const std::chrono::milliseconds& timeout) {
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& key : keys) {
    std::chrono::milliseconds left = timeout;
    if (timeout != gloo::kNoTimeout) {
      left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start);
      if (left <= std::chrono::milliseconds(0)) {
        throw gloo::IoException(
            absl::StrCat("coordinator store: Wait timeout for key(s): ", prefix_,
                         absl::StrJoin(keys, ", "), " after ", timeout.count(), " ms"));
      }
    }
    WaitFor(key, left);
  }
}

}  // namespace onebit
