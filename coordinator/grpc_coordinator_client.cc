// CoordinatorClient over gRPC: deadlines on every call, retries with backoff for the
// idempotent ones, and sessions on a background thread that reconnect.
#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_client.h"
#include "proto/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "security/auth.h"
#include "security/tls.h"
#include "onebit/v1/coordinator.grpc.pb.h"

namespace onebit {
namespace {

using Stub = v1::Coordinator::Stub;

// How long a waiting KvGet may take when it names no timeout (the coordinator's own bound
// is shorter by default; this only sizes the call's deadline).
constexpr absl::Duration kDefaultKvWait = absl::Seconds(30);

absl::Duration Jittered(absl::Duration d) {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen = new absl::BitGen();
  absl::MutexLock lock(&mu);
  return d * absl::Uniform(*gen, 0.8, 1.2);
}

class GrpcSession final : public CoordinatorSession {
 public:
  GrpcSession(std::shared_ptr<grpc::Channel> channel, std::shared_ptr<Stub> stub,
              const GrpcClientOptions& client_options, const SessionOptions& options,
              JobEventCallback on_event)
      : channel_(std::move(channel)),
        stub_(std::move(stub)),
        client_options_(client_options),
        options_(options),
        on_event_(std::move(on_event)) {}

  ~GrpcSession() override { Stop().IgnoreError(); }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }

  void SetStep(int64_t step) override { step_.store(step); }

  absl::Status Stop() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (context_ != nullptr) context_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }

  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  void Run();
  // One stream, from connect to finish.
  grpc::Status RunStream();

  const std::shared_ptr<grpc::Channel> channel_;
  const std::shared_ptr<Stub> stub_;
  const GrpcClientOptions client_options_;
  const SessionOptions options_;
  const JobEventCallback on_event_;
  std::atomic<int64_t> step_{0};
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // the current stream's
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool got_event_ = false;  // on the current stream; only the session thread touches it
  // The last stream that worked ended with the coordinator saying it stops.
  bool coordinator_stopping_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::Status GrpcSession::RunStream() {
  grpc::ClientContext context;
  if (!client_options_.token.empty()) {
    context.AddMetadata(security::kAuthorizationKey, security::BearerValue(client_options_.token));
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status::CANCELLED;
    context_ = &context;
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::Heartbeat, v1::JobEvent>> stream =
      stub_->Session(&context);
  bool stream_over = false;  // guarded by mu_; tells the writer to quit
  std::thread writer([&] {
    v1::Heartbeat heartbeat;
    heartbeat.set_role(options_.role);
    heartbeat.set_rank(options_.rank);
    heartbeat.set_instance_id(options_.instance_id);
    while (true) {
      heartbeat.set_step(step_.load());
      if (!stream->Write(heartbeat)) return;
      absl::MutexLock lock(&mu_);
      auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || stream_over; };
      if (mu_.AwaitWithTimeout(absl::Condition(&done), options_.heartbeat_interval)) return;
    }
  });
  v1::JobEvent event;
  got_event_ = false;
  bool stopping = false;  // the coordinator's last word: it is being stopped
  while (stream->Read(&event)) {
    got_event_ = true;
    stopping = event.coordinator_stopping();
    if (on_event_ && event.has_job()) on_event_(event);
  }
  {
    absl::MutexLock lock(&mu_);
    stream_over = true;
  }
  // Reads are over, so the call is over: a Write still in flight fails promptly.
  writer.join();
  grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  if (got_event_) coordinator_stopping_ = stopping;
  return status;
}

void GrpcSession::Run() {
  absl::Duration backoff = client_options_.initial_backoff;
  // When a stream last worked (it ended after carrying events), or the session started.
  absl::Time last_contact = absl::Now();
  absl::Status ended;
  while (true) {
    const grpc::Status status = RunStream();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    // The coordinator went away or restarts, the session was cut, or the coordinator had
    // too many sessions open for a moment: connect again. Any other error is an answer
    // about this member (not registered, wrong id, no token): final.
    const grpc::StatusCode code = status.error_code();
    if (!status.ok() && code != grpc::StatusCode::UNAVAILABLE &&
        code != grpc::StatusCode::CANCELLED && code != grpc::StatusCode::DEADLINE_EXCEEDED &&
        code != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ended = FromGrpcStatus(status);
      break;
    }
    if (got_event_) {
      backoff = client_options_.initial_backoff;
      last_contact = absl::Now();
    }
    if (absl::Now() - last_contact >= options_.silence_limit &&
        options_.silence_limit < options_.give_up_after && !coordinator_stopping_) {
      ended = absl::AbortedError(absl::StrCat(
          "no stream to the coordinator at ", client_options_.address, " for ",
          absl::FormatDuration(absl::Now() - last_contact), " (last: ", status.error_message(),
          "; the session's silence limit is ", absl::FormatDuration(options_.silence_limit),
          "): cut off, this member counts as dead there"));
      break;
    }
    if (absl::Now() - last_contact >= options_.give_up_after) {
      ended = absl::UnavailableError(absl::StrCat(
          "no answer from the coordinator at ", client_options_.address, " for ",
          absl::FormatDuration(absl::Now() - last_contact), " (last: ", status.error_message(), ")"));
      break;
    }
    // As BackOff, in slices, so that Stop() is not kept waiting.
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    const absl::Time until = absl::Now() + Jittered(backoff);
    if (channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), until - absl::Now())) return;
    } else {
      bool connected = false;
      while (!connected && !stopping_ && absl::Now() < until) {
        mu_.Unlock();
        connected = channel_->WaitForConnected(
            absl::ToChronoTime(std::min(until, absl::Now() + absl::Milliseconds(100))));
        mu_.Lock();
      }
      if (stopping_) return;
    }
    backoff = std::min(backoff * 2, client_options_.max_backoff);
  }
  {
    absl::MutexLock lock(&mu_);
    status_ = ended;
  }
  if (options_.on_end) options_.on_end(ended);
}

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  GrpcCoordinatorClient(const GrpcClientOptions& options, std::shared_ptr<grpc::Channel> channel)
      : options_(options), channel_(channel), stub_(v1::Coordinator::NewStub(channel)) {}

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    return Call<v1::RegisterResponse>(kRetry, absl::ZeroDuration(),
                                      [&](grpc::ClientContext* c, v1::RegisterResponse* r) {
                                        return stub_->Register(c, request, r);
                                      });
  }
  absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& request) override {
    return Call<v1::KvSetResponse>(
        kRetry, absl::ZeroDuration(),
        [&](grpc::ClientContext* c, v1::KvSetResponse* r) { return stub_->KvSet(c, request, r); });
  }
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request) override {
    absl::Duration wait = absl::ZeroDuration();
    if (request.wait()) {
      wait = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms()) : kDefaultKvWait;
    }
    return Call<v1::KvGetResponse>(kRetry, wait, [&](grpc::ClientContext* c, v1::KvGetResponse* r) {
      return stub_->KvGet(c, request, r);
    });
  }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) override {
    return Call<v1::LeaseResponse>(
        kRetry, absl::ZeroDuration(),
        [&](grpc::ClientContext* c, v1::LeaseResponse* r) { return stub_->Lease(c, request, r); });
  }
  absl::StatusOr<v1::StatsReportResponse> ReportStats(const v1::StatsReport& report) override {
    return Call<v1::StatsReportResponse>(kRetry, absl::ZeroDuration(),
                                         [&](grpc::ClientContext* c, v1::StatsReportResponse* r) {
                                           return stub_->ReportStats(c, report, r);
                                         });
  }
  absl::StatusOr<v1::JobStatus> ReportFailure(const v1::FailureReport& report) override {
    return Call<v1::JobStatus>(kRetry, absl::ZeroDuration(),
                               [&](grpc::ClientContext* c, v1::JobStatus* r) {
                                 return stub_->ReportFailure(c, report, r);
                               });
  }
  absl::StatusOr<std::unique_ptr<CoordinatorSession>> StartSession(
      const SessionOptions& options, JobEventCallback on_event) override {
    if (options.heartbeat_interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("heartbeat_interval must be positive");
    }
    auto session =
        std::make_unique<GrpcSession>(channel_, stub_, options_, options, std::move(on_event));
    session->Start();
    return std::unique_ptr<CoordinatorSession>(std::move(session));
  }
  absl::StatusOr<v1::JobStatus> GetJob(const v1::GetJobRequest& request) override {
    return Call<v1::JobStatus>(
        kRetry, absl::ZeroDuration(),
        [&](grpc::ClientContext* c, v1::JobStatus* r) { return stub_->GetJob(c, request, r); });
  }
  absl::StatusOr<v1::ListMembersResponse> ListMembers(
      const v1::ListMembersRequest& request) override {
    return Call<v1::ListMembersResponse>(kRetry, absl::ZeroDuration(),
                                         [&](grpc::ClientContext* c, v1::ListMembersResponse* r) {
                                           return stub_->ListMembers(c, request, r);
                                         });
  }
  absl::StatusOr<v1::JobStatus> Freeze(const v1::FreezeRequest& request) override {
    return Call<v1::JobStatus>(
        kOnce, absl::ZeroDuration(),
        [&](grpc::ClientContext* c, v1::JobStatus* r) { return stub_->Freeze(c, request, r); });
  }
  absl::StatusOr<v1::JobStatus> DelayFreeze(const v1::DelayFreezeRequest& request) override {
    return Call<v1::JobStatus>(kOnce, absl::ZeroDuration(),
                               [&](grpc::ClientContext* c, v1::JobStatus* r) {
                                 return stub_->DelayFreeze(c, request, r);
                               });
  }
  absl::StatusOr<v1::JobStatus> Stop(const v1::StopRequest& request) override {
    return Call<v1::JobStatus>(
        kOnce, absl::ZeroDuration(),
        [&](grpc::ClientContext* c, v1::JobStatus* r) { return stub_->Stop(c, request, r); });
  }
  // Idempotent: a part reported twice is recorded once.
  absl::StatusOr<v1::CommitPartResponse> CommitPart(const v1::CommitPartRequest& request) override {
    return Call<v1::CommitPartResponse>(kRetry, absl::ZeroDuration(),
                                        [&](grpc::ClientContext* c, v1::CommitPartResponse* r) {
                                          return stub_->CommitPart(c, request, r);
                                        });
  }
  absl::StatusOr<v1::CheckpointInfo> Checkpoint(const v1::CheckpointRequest& request) override {
    return Call<v1::CheckpointInfo>(kOnce, absl::ZeroDuration(),
                                    [&](grpc::ClientContext* c, v1::CheckpointInfo* r) {
                                      return stub_->Checkpoint(c, request, r);
                                    });
  }
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request) override {
    return Call<v1::ListCheckpointsResponse>(
        kRetry, absl::ZeroDuration(), [&](grpc::ClientContext* c, v1::ListCheckpointsResponse* r) {
          return stub_->ListCheckpoints(c, request, r);
        });
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }

 private:
  static constexpr bool kRetry = true;
  static constexpr bool kOnce = false;

  template <typename Response, typename Invoke>
  absl::StatusOr<Response> Call(bool idempotent, absl::Duration extra_deadline, Invoke invoke) {
    absl::Duration backoff = options_.initial_backoff;
    const absl::Time give_up = absl::Now() + options_.retry_for;
    for (int attempt = 1;; ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout + extra_deadline));
      if (!options_.token.empty()) {
        context.AddMetadata(security::kAuthorizationKey, security::BearerValue(options_.token));
      }
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return Cancelled();
        in_flight_.insert(&context);
      }
      Response response;
      const grpc::Status status = invoke(&context, &response);
      {
        absl::MutexLock lock(&mu_);
        in_flight_.erase(&context);
        if (cancelled_) return Cancelled();
      }
      if (status.ok()) return response;
      // CANCELLED that this client did not ask for (cancelled_ is false here): the
      // coordinator shut down with the call in flight (it restarts, or a launch's job ended
      // while the member is on to the next): as UNAVAILABLE, as the session takes it.
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
          status.error_code() != grpc::StatusCode::CANCELLED) {
        return FromGrpcStatus(status);
      }
      const bool more = options_.retry_for > absl::ZeroDuration() ? absl::Now() < give_up
                                                                  : attempt < options_.max_attempts;
      if (!idempotent || !more) {
        return absl::UnavailableError(
            absl::StrCat("coordinator at ", options_.address, " is unavailable (", attempt,
                         " attempt", attempt == 1 ? "" : "s", "): ", status.error_message(),
            security::HandshakeHint(options_.tls)));
      }
      if (!BackOffUnlessCancelled(Jittered(backoff))) return Cancelled();
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }

  absl::Status Cancelled() const {
    return absl::CancelledError(absl::StrCat("the call to the coordinator at ", options_.address,
                                             " was cancelled: this process is shutting down"));
  }

  // Waits out a retry's backoff while driving the channel's reconnection, in slices of
  // 100 ms; false as soon as Cancel() was called. A synchronous client makes progress on
  // a connection only while some call polls it, so a plain sleep leaves a reconnect that a
  // failed call started unfinished until gRPC's connect timer cuts it: seen as a session
  // kept 15 s from a restarted coordinator (every attempt "tcp handshaker shutdown" after
  // the 2 s connect timeout) while the process's other threads sat in calls to other
  // servers. Returns early once connected; a channel that was connected already (the call
  // failed for another reason) waits the whole backoff.
  bool BackOffUnlessCancelled(absl::Duration backoff) ABSL_LOCKS_EXCLUDED(mu_) {
    const absl::Time until = absl::Now() + backoff;
    const bool was_ready = channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    absl::MutexLock lock(&mu_);
    while (!cancelled_ && absl::Now() < until) {
      const absl::Time slice = std::min(until, absl::Now() + absl::Milliseconds(100));
      mu_.Unlock();
      bool connected = false;
      if (was_ready) {
        absl::SleepFor(slice - absl::Now());
      } else {
        connected = channel_->WaitForConnected(absl::ToChronoTime(slice));
      }
      mu_.Lock();
      if (connected) break;
    }
    return !cancelled_;
  }

  const GrpcClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::shared_ptr<Stub> stub_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<v1::RegisterResponse> RegisterReplacing(CoordinatorClient& client,
                                                       const v1::RegisterRequest& request,
                                                       absl::Duration wait) {
  const absl::Time give_up = absl::Now() + wait;
  for (;;) {
    absl::StatusOr<v1::RegisterResponse> reg = client.Register(request);
    if (reg.ok() || reg.status().code() != absl::StatusCode::kResourceExhausted ||
        absl::Now() >= give_up) {
      return reg;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> NewGrpcCoordinatorClient(
    const GrpcClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("coordinator address is empty (want host:port)");
  }
  if (options.max_attempts < 1 || options.rpc_timeout <= absl::ZeroDuration() ||
      options.initial_backoff < absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(
        "client options: need max_attempts >= 1, rpc_timeout > 0, "
        "0 <= initial_backoff <= max_backoff");
  }
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff starts at 1 s and grows to 2 min; a worker that starts
  // before its coordinator should find it within our retries instead.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Also gRPC's connect timeout (TCP plus the HTTP/2 SETTINGS frame): a coordinator that
  // is down refuses at once, so this only has to outlast a slow one (100 ms was too short
  // on a loaded machine).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, security::ConnectTimeoutMs(options.tls, 2000));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options.keepalive < absl::InfiniteDuration()) {
    // HTTP/2 pings, answered by the server's transport (no thread of its own per ping).
    // On Linux gRPC also sets TCP_USER_TIMEOUT to the ping timeout, so unacknowledged
    // heartbeats end the connection too.
    const int ms =
        static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options.keepalive)));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  args.SetMaxReceiveMessageSize(kCoordinatorMaxMessageBytes);
  args.SetMaxSendMessageSize(kCoordinatorMaxMessageBytes);
  security::AddTlsChannelArguments(options.tls, &args);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      security::GrpcChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.address, *credentials, args);
  return std::unique_ptr<CoordinatorClient>(new GrpcCoordinatorClient(options, channel));
}

}  // namespace onebit
