#include "coordinator/grpc_service.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/grpc_status.h"

namespace onebit {
namespace {

// How often a session's writer looks at its stream's cancellation while nothing happens
// (a client that goes away also ends the reader, which wakes the writer at once).
constexpr absl::Duration kSessionPoll = absl::Seconds(1);
// How long the watcher waits for a change before it looks at Shutdown again.
constexpr absl::Duration kWatchPoll = absl::Milliseconds(200);

}  // namespace

CoordinatorGrpcService::~CoordinatorGrpcService() {
  Shutdown();
  std::thread watcher;
  {
    absl::MutexLock lock(&sessions_mu_);
    watcher = std::move(watcher_);
  }
  if (watcher.joinable()) watcher.join();
}

void CoordinatorGrpcService::Shutdown() {
  shutting_down_ = true;
  absl::MutexLock lock(&sessions_mu_);
  for (SessionState* session : sessions_) {
    absl::MutexLock session_lock(&session->mu);
    session->shutting_down = true;
  }
}

void CoordinatorGrpcService::AddSession(SessionState* session) {
  absl::MutexLock lock(&sessions_mu_);
  sessions_.insert(session);
  {
    absl::MutexLock session_lock(&session->mu);
    session->shutting_down = shutting_down_;
    session->latest = latest_;
    session->latest_version = latest_version_;
  }
  if (!watcher_.joinable() && !shutting_down_) watcher_ = std::thread([this] { WatchJob(); });
}

void CoordinatorGrpcService::RemoveSession(SessionState* session) {
  absl::MutexLock lock(&sessions_mu_);
  sessions_.erase(session);
}

void CoordinatorGrpcService::WatchJob() {
  uint64_t seen = 0;
  while (!shutting_down_) {
    const absl::Time waited_from = absl::Now();
    // A shut-down handler returns at once: do not spin.
    const auto pause = [&] { absl::SleepFor(kWatchPoll - (absl::Now() - waited_from)); };
    // Read the version before the status: a change in between only causes one more event.
    const uint64_t version = handler_->WaitForJobChange(seen, kWatchPoll);
    if (version == seen) {
      pause();
      continue;
    }
    absl::StatusOr<v1::JobStatus> job = handler_->GetJob(v1::GetJobRequest());
    if (!job.ok()) {
      pause();
      continue;
    }
    auto event = std::make_shared<v1::JobEvent>();
    *event->mutable_job() = *std::move(job);
    absl::MutexLock lock(&sessions_mu_);
    latest_ = event;
    latest_version_ = version;
    for (SessionState* session : sessions_) {
      absl::MutexLock session_lock(&session->mu);
      session->latest = event;
      session->latest_version = version;
    }
    seen = version;
  }
}

absl::Status CoordinatorGrpcService::Authorize(const char* method, security::Access access,
                                              const grpc::ServerContext* context) {
  std::string authorization;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(security::kAuthorizationKey);
  if (it != metadata.end()) authorization.assign(it->second.data(), it->second.size());
  absl::Status status = security::Authorize(options_.tokens, access, authorization, method);
  if (!status.ok() && metrics_ != nullptr) metrics_->RpcError(method);
  return status;
}

template <typename Response>
grpc::Status CoordinatorGrpcService::Reply(const char* method, absl::StatusOr<Response> result,
                                           Response* response) {
  if (!result.ok()) {
    if (metrics_ != nullptr) metrics_->RpcError(method);
    return ToGrpcStatus(result.status());
  }
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status CoordinatorGrpcService::Register(grpc::ServerContext* context,
                                              const v1::RegisterRequest* request,
                                              v1::RegisterResponse* response) {
  if (absl::Status auth = Authorize("Register", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("Register", handler_->Register(*request), response);
}

grpc::Status CoordinatorGrpcService::KvSet(grpc::ServerContext* context, const v1::KvSetRequest* request,
                                           v1::KvSetResponse* response) {
  if (absl::Status auth = Authorize("KvSet", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("KvSet", handler_->KvSet(*request), response);
}

grpc::Status CoordinatorGrpcService::KvGet(grpc::ServerContext* context,
                                           const v1::KvGetRequest* request,
                                           v1::KvGetResponse* response) {
  if (absl::Status auth = Authorize("KvGet", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  v1::KvGetRequest bounded = *request;
  // Waiting past the caller's deadline would only hold a thread for nobody.
  const auto deadline = context->deadline();
  if (request->wait() && request->timeout_ms() >= 0 &&
      deadline != std::chrono::system_clock::time_point::max()) {
    const int64_t left_ms =
        std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(
                                 deadline - std::chrono::system_clock::now())
                                 .count());
    if (bounded.timeout_ms() == 0 || bounded.timeout_ms() > left_ms) {
      bounded.set_timeout_ms(left_ms);
    }
  }
  return Reply("KvGet", handler_->KvGet(bounded), response);
}

grpc::Status CoordinatorGrpcService::Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                                           v1::LeaseResponse* response) {
  if (absl::Status auth = Authorize("Lease", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("Lease", handler_->Lease(*request), response);
}

grpc::Status CoordinatorGrpcService::ReportStats(grpc::ServerContext* context,
                                                 const v1::StatsReport* request,
                                                 v1::StatsReportResponse* response) {
  if (absl::Status auth = Authorize("ReportStats", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("ReportStats", handler_->ReportStats(*request), response);
}

grpc::Status CoordinatorGrpcService::ReportFailure(grpc::ServerContext* context,
                                                   const v1::FailureReport* request,
                                                   v1::JobStatus* response) {
  if (absl::Status auth = Authorize("ReportFailure", security::Access::kMember, context);
      !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("ReportFailure", handler_->ReportFailure(*request), response);
}

grpc::Status CoordinatorGrpcService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                            v1::JobStatus* response) {
  if (absl::Status auth = Authorize("GetJob", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("GetJob", handler_->GetJob(*request), response);
}

grpc::Status CoordinatorGrpcService::ListMembers(grpc::ServerContext* context,
                                                 const v1::ListMembersRequest* request,
                                                 v1::ListMembersResponse* response) {
  if (absl::Status auth = Authorize("ListMembers", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("ListMembers", handler_->ListMembers(*request), response);
}

grpc::Status CoordinatorGrpcService::Freeze(grpc::ServerContext* context, const v1::FreezeRequest* request,
                                            v1::JobStatus* response) {
  if (absl::Status auth = Authorize("Freeze", security::Access::kAdmin, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("Freeze", handler_->Freeze(*request), response);
}

grpc::Status CoordinatorGrpcService::DelayFreeze(grpc::ServerContext* context,
                                                 const v1::DelayFreezeRequest* request,
                                                 v1::JobStatus* response) {
  if (absl::Status auth = Authorize("DelayFreeze", security::Access::kAdmin, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("DelayFreeze", handler_->DelayFreeze(*request), response);
}

grpc::Status CoordinatorGrpcService::Stop(grpc::ServerContext* context, const v1::StopRequest* request,
                                          v1::JobStatus* response) {
  if (absl::Status auth = Authorize("Stop", security::Access::kAdmin, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("Stop", handler_->Stop(*request), response);
}

grpc::Status CoordinatorGrpcService::CommitPart(grpc::ServerContext* context,
                                                const v1::CommitPartRequest* request,
                                                v1::CommitPartResponse* response) {
  if (absl::Status auth = Authorize("CommitPart", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("CommitPart", handler_->CommitPart(*request), response);
}

grpc::Status CoordinatorGrpcService::Checkpoint(grpc::ServerContext* context,
                                                const v1::CheckpointRequest* request,
                                                v1::CheckpointInfo* response) {
  if (absl::Status auth = Authorize("Checkpoint", security::Access::kAdmin, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("Checkpoint", handler_->Checkpoint(*request), response);
}

grpc::Status CoordinatorGrpcService::ListCheckpoints(grpc::ServerContext* context,
                                                     const v1::ListCheckpointsRequest* request,
                                                     v1::ListCheckpointsResponse* response) {
  if (absl::Status auth = Authorize("ListCheckpoints", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  return Reply("ListCheckpoints", handler_->ListCheckpoints(*request), response);
}

grpc::Status CoordinatorGrpcService::Session(
    grpc::ServerContext* context, grpc::ServerReaderWriter<v1::JobEvent, v1::Heartbeat>* stream) {
  if (absl::Status auth = Authorize("Session", security::Access::kMember, context); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  // Over the bound, refused before it holds anything (and without counting itself, so a
  // flood of refused sessions never crowds out one that fits).
  int open = open_sessions_.load();
  do {
    if (options_.max_sessions > 0 && open >= options_.max_sessions) {
      if (metrics_ != nullptr) metrics_->RpcError("Session");
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("too many open sessions (at most ", options_.max_sessions,
                                       " at once); a member has one each"));
    }
  } while (!open_sessions_.compare_exchange_weak(open, open + 1));
  struct Release {
    std::atomic<int>* count;
    ~Release() { count->fetch_sub(1); }
  } release{&open_sessions_};
  SessionState state;
  AddSession(&state);
  struct Leave {
    CoordinatorGrpcService* service;
    SessionState* state;
    ~Leave() { service->RemoveSession(state); }
  } leave{this, &state};
  // Reads and writes may run concurrently on a sync stream (one reader, one writer).
  std::thread reader([&] {
    v1::Heartbeat heartbeat;
    while (stream->Read(&heartbeat)) {
      const absl::Time start = absl::Now();
      absl::Status status = handler_->Heartbeat(heartbeat);
      if (metrics_ != nullptr) {
        metrics_->ObserveHeartbeat(absl::ToDoubleSeconds(absl::Now() - start));
      }
      absl::MutexLock lock(&state.mu);
      if (!status.ok()) {
        state.error = status;
        break;
      }
      state.got_heartbeat = true;
    }
    absl::MutexLock lock(&state.mu);
    state.reader_done = true;
  });

  // Why the loop below ended; OK when the client closed its side.
  grpc::Status result = grpc::Status::OK;
  bool reader_blocked = true;  // it may still sit in Read, which only a cancel ends
  uint64_t sent_version = 0;   // 0: no event sent yet (versions start at 1)
  bool refused = false;        // the handler refused a heartbeat
  bool stopping = false;       // this coordinator is being stopped
  while (true) {
    bool ready = false;  // the first heartbeat came (before the first event)
    std::shared_ptr<const v1::JobEvent> next;
    uint64_t next_version = 0;
    {
      absl::MutexLock lock(&state.mu);
      auto woken = [&state, sent_version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
        return !state.error.ok() || state.reader_done || state.shutting_down ||
               (sent_version == 0 ? state.got_heartbeat : state.latest_version > sent_version);
      };
      state.mu.AwaitWithTimeout(absl::Condition(&woken), kSessionPoll);
      if (!state.error.ok()) {
        result = ToGrpcStatus(state.error);
        reader_blocked = false;
        // A heartbeat this coordinator refuses (most often: it does not know the member,
        // having restarted since the member registered) ends the session; the job's status
        // goes first, so that the member learns the generation it must restart for.
        refused = true;
        break;
      }
      if (state.reader_done) {
        reader_blocked = false;
        break;
      }
      if (state.shutting_down) {
        result = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
        stopping = true;
        break;
      }
      ready = state.got_heartbeat;
      if (state.latest_version > sent_version) {
        next = state.latest;
        next_version = state.latest_version;
      }
    }
    if (context->IsCancelled()) break;
    if (sent_version == 0) {
      if (!ready) continue;
      // The first event is the job as it is now (the watcher's may be older).
      const uint64_t version = handler_->WaitForJobChange(0, absl::ZeroDuration());
      absl::StatusOr<v1::JobStatus> job = handler_->GetJob(v1::GetJobRequest());
      if (!job.ok()) {
        result = ToGrpcStatus(job.status());
        break;
      }
      v1::JobEvent event;
      *event.mutable_job() = *std::move(job);
      if (!stream->Write(event)) break;  // the client is gone
      sent_version = version;
      continue;
    }
    if (next == nullptr) continue;
    if (!stream->Write(*next)) break;  // the client is gone
    sent_version = next_version;
  }
  if (refused && !context->IsCancelled()) {
    absl::StatusOr<v1::JobStatus> job = handler_->GetJob(v1::GetJobRequest());
    if (job.ok()) {
      v1::JobEvent event;
      *event.mutable_job() = *std::move(job);
      stream->Write(event);
    }
  }
  if (stopping && !context->IsCancelled()) {
    // Said before the cancel below, which would drop a status's details on the way.
    v1::JobEvent event;
    absl::StatusOr<v1::JobStatus> job = handler_->GetJob(v1::GetJobRequest());
    if (job.ok()) *event.mutable_job() = *std::move(job);
    event.set_coordinator_stopping(true);
    stream->Write(event);
  }
  if (reader_blocked) context->TryCancel();
  reader.join();
  if (!result.ok() && metrics_ != nullptr) metrics_->RpcError("Session");
  return result;
}

}  // namespace onebit
