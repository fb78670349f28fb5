// The secured control plane with real gRPC and HTTPS servers on 127.0.0.1 and certificates
// made by the real openssl command (security/test_certs.h):
//   - mutual TLS: a member with a certificate of the job's CA registers; one without a
//     certificate, with a self-signed ("rogue") one, or over plaintext cannot connect at
//     all (UNAVAILABLE, and the message says TLS);
//   - tokens: admin calls without or with a wrong token are UNAUTHENTICATED (REST: 401),
//     the member token on an admin call PERMISSION_DENIED (403), the admin token OK; the
//     rendezvous store and the reads need the member (or admin) token;
//   - the REST mirror serves HTTPS and wants a client certificate too;
//   - shards: only workers with a certificate of the CA can push;
//   - limits: messages over the size bound are RESOURCE_EXHAUSTED both ways; a flood of
//     sessions beyond the bound is refused with RESOURCE_EXHAUSTED while GetJob still
//     answers; a flood of waiting calls beyond the thread bound is refused, not crashed,
//     and the threads stay bounded.
#include <dirent.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "config/job_config.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/test_coordinator.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "kernels/kernels.h"
#include "onebit/v1/coordinator.grpc.pb.h"
#include "onebit/v1/exchange.grpc.pb.h"
#include "security/auth.h"
#include "security/test_certs.h"
#include "security/tls.h"
#include "server/server_process.h"
#include "tests/test_paths.h"
#include "worker/exchange/ps_exchange.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;
using security::TestCerts;
using security::TlsOptions;

const char kAdminToken[] = "admin-3f1c9a7e5b2d4c6e8a0b1c2d3e4f5a6b";
const char kMemberToken[] = "member-9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b";

v1::RegisterRequest Worker(const std::string& id) {
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_instance_id(id);
  r.set_requested_rank(-1);
  r.set_address("127.0.0.1");
  return r;
}

// The threads of this process, from /proc.
int ThreadCount() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}

class SecureControlPlaneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TestCerts> made = security::MakeTestCerts(testing_paths::TestTmpDir() + "/pki");
    if (!made.ok()) {
      error_ = new std::string(made.status().ToString());
      return;
    }
    certs_ = new TestCerts(*made);
  }

  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
    delete error_;
    error_ = nullptr;
  }

  void SetUp() override {
    // Fails (never skips) without openssl: the message says what to install.
    ASSERT_NE(certs_, nullptr) << "cannot make the test certificates: " << *error_;
  }

  // A coordinator of a 2-worker peer job with mutual TLS and both tokens.
  void StartCoordinator(CoordinatorServerOptions server_options = {}) {
    CoordinatorOptions options;
    options.config = TestJobConfig(2, 100, 10, 40);
    options.job_id = "secure-job";
    server_options.tick = absl::Milliseconds(20);
    server_options.metrics_port = -1;
    if (!server_options.tls.enabled()) server_options.tls = certs_->Node();
    if (server_options.tokens.admin.empty()) server_options.tokens = {kAdminToken, kMemberToken};
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options, server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<CoordinatorClient> Client(const TlsOptions& tls, const std::string& token) {
    GrpcClientOptions options;
    options.address = server_->grpc_address();
    options.tls = tls;
    options.token = token;
    options.max_attempts = 2;
    options.rpc_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = NewGrpcCoordinatorClient(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A raw stub (no retries, no client-side limits unless `args` sets them).
  std::unique_ptr<v1::Coordinator::Stub> RawStub(const TlsOptions& tls,
                                                 grpc::ChannelArguments args = {}) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        security::GrpcChannelCredentials(tls);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(server_->grpc_address(), *credentials, args));
  }

  size_t Members() {
    absl::StatusOr<v1::ListMembersResponse> members =
        Client(certs_->Client(), kAdminToken)->ListMembers({});
    EXPECT_TRUE(members.ok()) << members.status();
    return members.ok() ? members->members_size() : 0;
  }

  static TestCerts* certs_;
  static std::string* error_;
  std::unique_ptr<CoordinatorServer> server_;
};
TestCerts* SecureControlPlaneTest::certs_ = nullptr;
std::string* SecureControlPlaneTest::error_ = nullptr;

TEST_F(SecureControlPlaneTest, MemberWithAValidCertificateRegistersAndMeetsOthers) {
  StartCoordinator();
  std::unique_ptr<CoordinatorClient> a = Client(certs_->Client(), kMemberToken);
  std::unique_ptr<CoordinatorClient> b = Client(certs_->Node(), kMemberToken);
  absl::StatusOr<v1::RegisterResponse> ra = a->Register(Worker("w-a"));
  ASSERT_TRUE(ra.ok()) << ra.status();
  absl::StatusOr<v1::RegisterResponse> rb = b->Register(Worker("w-b"));
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_NE(ra->rank(), rb->rank());
  // The rendezvous store between the two members.
  v1::KvSetRequest set;
  set.set_key("job/nccl_id");
  set.set_value("id-bytes");
  ASSERT_TRUE(a->KvSet(set).ok());
  v1::KvGetRequest get;
  get.set_key("job/nccl_id");
  get.set_wait(true);
  get.set_timeout_ms(2000);
  absl::StatusOr<v1::KvGetResponse> got = b->KvGet(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value(), "id-bytes");
  // A session over TLS with the token gets its events.
  std::atomic<int> events{0};
  SessionOptions session;
  session.rank = ra->rank();
  session.instance_id = "w-a";
  session.heartbeat_interval = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<CoordinatorSession>> s =
      a->StartSession(session, [&](const v1::JobEvent&) { ++events; });
  ASSERT_TRUE(s.ok()) << s.status();
  for (int i = 0; i < 200 && events.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GT(events.load(), 0);
  EXPECT_TRUE((*s)->Stop().ok());
  EXPECT_EQ(Members(), 2u);
}

TEST_F(SecureControlPlaneTest, MemberWithoutAValidCertificateCannotConnect) {
  StartCoordinator();
  struct Case {
    const char* what;
    TlsOptions tls;
  };
  const Case cases[] = {
      {"no client certificate", certs_->NoCert()},
      {"a self-signed certificate", certs_->Rogue()},
      {"plaintext", TlsOptions()},
  };
  for (const Case& c : cases) {
    std::unique_ptr<CoordinatorClient> client = Client(c.tls, kMemberToken);
    absl::StatusOr<v1::RegisterResponse> reg = client->Register(Worker("intruder"));
    ASSERT_FALSE(reg.ok()) << c.what;
    std::cout << c.what << ": " << reg.status() << std::endl;  // what an operator would read
    EXPECT_EQ(reg.status().code(), absl::StatusCode::kUnavailable) << c.what << ": " << reg.status();
    if (c.tls.enabled()) {
      EXPECT_THAT(std::string(reg.status().message()), HasSubstr("TLS")) << c.what;
    }
    // Nor can it read or use the rendezvous store.
    EXPECT_EQ(client->GetJob({}).status().code(), absl::StatusCode::kUnavailable) << c.what;
    v1::KvSetRequest set;
    set.set_key("k");
    set.set_value("v");
    EXPECT_EQ(client->KvSet(set).status().code(), absl::StatusCode::kUnavailable) << c.what;
  }
  EXPECT_EQ(Members(), 0u);
}

TEST_F(SecureControlPlaneTest, MemberCallsAndReadsNeedTheMemberToken) {
  StartCoordinator();
  for (const std::string& token : {std::string(), std::string("not-the-member-token-at-all")}) {
    std::unique_ptr<CoordinatorClient> client = Client(certs_->Client(), token);
    EXPECT_EQ(client->Register(Worker("w")).status().code(), absl::StatusCode::kUnauthenticated);
    v1::KvSetRequest set;
    set.set_key("k");
    set.set_value("v");
    const absl::Status kv = client->KvSet(set).status();
    EXPECT_EQ(kv.code(), absl::StatusCode::kUnauthenticated) << kv;
    EXPECT_THAT(std::string(kv.message()), HasSubstr("KvSet needs a member or admin token"));
    v1::KvGetRequest get;
    get.set_key("k");
    EXPECT_EQ(client->KvGet(get).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->GetJob({}).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->ListMembers({}).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->ListCheckpoints({}).status().code(), absl::StatusCode::kUnauthenticated);
    // A session without the token ends for good with the same answer.
    SessionOptions session;
    session.instance_id = "w";
    session.heartbeat_interval = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<CoordinatorSession>> s = client->StartSession(session, nullptr);
    ASSERT_TRUE(s.ok());
    for (int i = 0; i < 200 && (*s)->status().ok(); ++i) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_EQ((*s)->status().code(), absl::StatusCode::kUnauthenticated) << (*s)->status();
  }
  EXPECT_EQ(Members(), 0u);
  // The member token and the admin token both read.
  EXPECT_TRUE(Client(certs_->Client(), kMemberToken)->GetJob({}).ok());
  EXPECT_TRUE(Client(certs_->Client(), kAdminToken)->GetJob({}).ok());
}

TEST_F(SecureControlPlaneTest, AdminCallsNeedTheAdminToken) {
  StartCoordinator();
  v1::FreezeRequest freeze;
  freeze.set_now(true);
  v1::DelayFreezeRequest delay;
  delay.set_to_step(60);
  v1::StopRequest stop;
  stop.set_after_step(90);
  for (const std::string& token :
       {std::string(), std::string("a-wrong-token-of-enough-length"), std::string(kAdminToken) + "x"}) {
    std::unique_ptr<CoordinatorClient> client = Client(certs_->Client(), token);
    const absl::Status s = client->Freeze(freeze).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Freeze needs the admin token"));
    EXPECT_EQ(client->DelayFreeze(delay).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->Stop(stop).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->Checkpoint({}).status().code(), absl::StatusCode::kUnauthenticated);
  }
  std::unique_ptr<CoordinatorClient> member = Client(certs_->Client(), kMemberToken);
  EXPECT_EQ(member->Freeze(freeze).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(member->Stop(stop).status().code(), absl::StatusCode::kPermissionDenied);
  // Nothing changed.
  absl::StatusOr<v1::JobStatus> before = member->GetJob({});
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->freeze_step(), 40);
  EXPECT_EQ(before->stop_after_step(), 100);

  std::unique_ptr<CoordinatorClient> admin = Client(certs_->Client(), kAdminToken);
  absl::StatusOr<v1::JobStatus> delayed = admin->DelayFreeze(delay);
  ASSERT_TRUE(delayed.ok()) << delayed.status();
  EXPECT_EQ(delayed->freeze_step(), 60);
  absl::StatusOr<v1::JobStatus> stopped = admin->Stop(stop);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->stop_after_step(), 90);
  // Checkpoint passes the token check and reaches the coordinator, which has no checkpoint
  // directory in this job.
  const absl::Status checkpoint = admin->Checkpoint({}).status();
  EXPECT_NE(checkpoint.code(), absl::StatusCode::kUnauthenticated) << checkpoint;
  EXPECT_NE(checkpoint.code(), absl::StatusCode::kPermissionDenied) << checkpoint;
}

TEST_F(SecureControlPlaneTest, RestMirrorServesHttpsAndChecksTokens) {
  StartCoordinator();
  const std::string url = "https://" + server_->rest_address();
  httplib::Client rest(url, certs_->client, certs_->client_key);
  rest.set_ca_cert_path(certs_->ca);
  rest.enable_server_certificate_verification(true);
  rest.set_connection_timeout(5);
  auto bearer = [](const std::string& token) {
    return httplib::Headers{{"Authorization", "Bearer " + token}};
  };

  httplib::Result no_token = rest.Get("/v1/job");
  ASSERT_TRUE(no_token) << httplib::to_string(no_token.error());
  EXPECT_EQ(no_token->status, 401);
  EXPECT_EQ(no_token->get_header_value("WWW-Authenticate"), "Bearer realm=\"onebit\"");
  EXPECT_THAT(no_token->body, HasSubstr("UNAUTHENTICATED"));
  httplib::Result read = rest.Get("/v1/job", bearer(kMemberToken));
  ASSERT_TRUE(read);
  EXPECT_EQ(read->status, 200) << read->body;
  EXPECT_THAT(read->body, HasSubstr("secure-job"));

  const std::string body = R"({"toStep": 70})";
  httplib::Result post = rest.Post("/v1/freeze/delay", body, "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 401) << post->body;
  post = rest.Post("/v1/freeze/delay", bearer("a-wrong-token-of-enough-length"), body,
                   "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 401) << post->body;
  post = rest.Post("/v1/freeze/delay", bearer(kMemberToken), body, "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 403) << post->body;
  post = rest.Post("/v1/freeze/delay", bearer(kAdminToken), body, "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 200) << post->body;
  EXPECT_THAT(post->body, HasSubstr("\"freezeStep\":\"70\""));

  // Without a client certificate the handshake fails; plain HTTP gets no answer either.
  httplib::Client anonymous(url);
  anonymous.set_ca_cert_path(certs_->ca);
  anonymous.enable_server_certificate_verification(true);
  anonymous.set_connection_timeout(5);
  EXPECT_FALSE(anonymous.Get("/v1/job", bearer(kAdminToken)));
  httplib::Client plain("http://" + server_->rest_address());
  plain.set_connection_timeout(5);
  plain.set_read_timeout(5);
  httplib::Result plain_result = plain.Get("/v1/job", bearer(kAdminToken));
  EXPECT_TRUE(!plain_result || plain_result->status >= 400);
  // A client that does not trust the CA refuses the server.
  httplib::Client untrusting(url, certs_->client, certs_->client_key);
  untrusting.set_ca_cert_path(certs_->rogue);
  untrusting.enable_server_certificate_verification(true);
  untrusting.set_connection_timeout(5);
  EXPECT_FALSE(untrusting.Get("/v1/job", bearer(kAdminToken)));
}

TEST_F(SecureControlPlaneTest, MessagesOverTheLimitAreRefusedBothWays) {
  StartCoordinator();
  const std::string big(kCoordinatorMaxMessageBytes + (1 << 20), 'x');
  v1::KvSetRequest set;
  set.set_key("big");
  set.set_value(big);
  // The client's own bound.
  std::unique_ptr<CoordinatorClient> client = Client(certs_->Client(), kMemberToken);
  EXPECT_EQ(client->KvSet(set).status().code(), absl::StatusCode::kResourceExhausted);
  // A client without a bound meets the server's.
  grpc::ChannelArguments unbounded;
  unbounded.SetMaxSendMessageSize(-1);
  std::unique_ptr<v1::Coordinator::Stub> stub = RawStub(certs_->Client(), unbounded);
  grpc::ClientContext context;
  context.AddMetadata(security::kAuthorizationKey, security::BearerValue(kMemberToken));
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::KvSetResponse response;
  const grpc::Status status = stub->KvSet(&context, set, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // And the coordinator carries on.
  EXPECT_TRUE(client->GetJob({}).ok());
}

TEST_F(SecureControlPlaneTest, SessionFloodIsRefusedAndGetJobStillAnswers) {
  CoordinatorServerOptions options;
  options.max_sessions = 4;
  StartCoordinator(options);
  constexpr int kStreams = 16;
  std::unique_ptr<v1::Coordinator::Stub> stub = RawStub(certs_->Client());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(kStreams);
  std::vector<grpc::Status> results(kStreams);
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    contexts[i] = std::make_unique<grpc::ClientContext>();
    contexts[i]->AddMetadata(security::kAuthorizationKey, security::BearerValue(kMemberToken));
    threads.emplace_back([&, i] {
      // Opens a session and never sends a heartbeat: it holds its server thread.
      auto stream = stub->Session(contexts[i].get());
      results[i] = stream->Finish();
      ++finished;
    });
  }
  // The streams beyond the bound are refused at once.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (finished.load() < kStreams - options.max_sessions && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(finished.load(), kStreams - options.max_sessions);
  // Meanwhile the coordinator answers.
  std::unique_ptr<CoordinatorClient> member = Client(certs_->Client(), kMemberToken);
  absl::StatusOr<v1::JobStatus> job = member->GetJob({});
  EXPECT_TRUE(job.ok()) << job.status();
  // A real member's session finds no slot either, but keeps trying instead of giving up...
  absl::StatusOr<v1::RegisterResponse> reg = member->Register(Worker("patient"));
  ASSERT_TRUE(reg.ok()) << reg.status();
  std::atomic<int> events{0};
  SessionOptions session;
  session.rank = reg->rank();
  session.instance_id = "patient";
  session.heartbeat_interval = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<CoordinatorSession>> patient =
      member->StartSession(session, [&](const v1::JobEvent&) { ++events; });
  ASSERT_TRUE(patient.ok());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE((*patient)->status().ok()) << (*patient)->status();
  EXPECT_EQ(events.load(), 0);
  for (auto& context : contexts) context->TryCancel();
  for (std::thread& t : threads) t.join();
  int refused = 0;
  for (const grpc::Status& s : results) {
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      EXPECT_THAT(s.error_message(), HasSubstr("too many open sessions"));
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
    }
  }
  EXPECT_EQ(refused, kStreams - options.max_sessions);
  // ... and gets in once the flood is gone.
  for (int i = 0; i < 500 && events.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GT(events.load(), 0);
  EXPECT_TRUE((*patient)->Stop().ok());
  EXPECT_TRUE(member->GetJob({}).ok());
}

TEST_F(SecureControlPlaneTest, WaitingCallsBeyondTheThreadBoundAreRefusedNotCrashed) {
  CoordinatorServerOptions options;
  options.max_threads = 12;
  StartCoordinator(options);
  const int threads_before = ThreadCount();
  constexpr int kCalls = 64;
  std::unique_ptr<v1::Coordinator::Stub> stub = RawStub(certs_->Client());
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext context;
    v1::KvGetResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::KvGetResponse>> reader;
  };
  std::vector<std::unique_ptr<Call>> calls;
  v1::KvGetRequest get;
  get.set_key("never-set");
  get.set_wait(true);
  get.set_timeout_ms(1500);
  for (int i = 0; i < kCalls; ++i) {
    auto call = std::make_unique<Call>();
    call->context.AddMetadata(security::kAuthorizationKey, security::BearerValue(kMemberToken));
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    call->reader = stub->AsyncKvGet(&call->context, get, &cq);
    call->reader->Finish(&call->response, &call->status, call.get());
    calls.push_back(std::move(call));
  }
  absl::SleepFor(absl::Milliseconds(500));
  const int threads_during = ThreadCount();
  int done = 0, refused = 0, timed_out = 0;
  void* tag = nullptr;
  bool ok = false;
  while (done < kCalls && cq.Next(&tag, &ok)) {
    ++done;
    const grpc::Status& s = static_cast<Call*>(tag)->status;
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++timed_out;
  }
  EXPECT_EQ(done, kCalls);
  EXPECT_GT(refused, 0) << "64 waiting calls with 12 threads: some must be refused";
  EXPECT_EQ(refused + timed_out, kCalls);
  // The server's threads grew by at most its bound (plus each call's own client-side
  // threads, which gRPC keeps few).
  EXPECT_LE(threads_during - threads_before, options.max_threads + 8)
      << "threads before " << threads_before << ", during " << threads_during;
  // Once the waits are over it answers again.
  EXPECT_TRUE(Client(certs_->Client(), kMemberToken)->GetJob({}).ok());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// ---- the shards ----

class SecureShardTest : public SecureControlPlaneTest {
 protected:
  void StartShard() {
    server::ServerProcessOptions options;
    options.shard.shard = 0;
    options.shard.num_shards = 1;
    options.shard.num_workers = 1;
    options.shard.n = kN;
    options.serve_metrics = false;
    options.shutdown_grace = absl::Milliseconds(200);
    options.tls = certs_->Node();
    absl::StatusOr<std::unique_ptr<server::ServerProcess>> shard = server::ServerProcess::Start(options);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = *std::move(shard);
  }
  absl::Status OneStep(const TlsOptions& tls) {
    PsExchangeOptions options;
    options.tls = tls;
    options.max_attempts = 2;
    options.retry_backoff = absl::Milliseconds(50);
    options.step_deadline = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<PsExchange>> exchange = PsExchange::Create(
        backend_.get(), 0, 1, kN, {shard_->grpc_address()}, options);
    if (!exchange.ok()) return exchange.status();
    std::vector<float> grad(kN, 0.5f);
    absl::StatusOr<const float*> sum = (*exchange)->SumGradients(++step_, grad.data());
    if (!sum.ok()) return sum.status();
    return (*sum)[kN - 1] == 0.5f ? absl::OkStatus() : absl::InternalError("wrong sum");
  }

  static constexpr size_t kN = 1000;
  std::unique_ptr<kernels::Backend> backend_ = kernels::NewCpuBackend();
  std::unique_ptr<server::ServerProcess> shard_;
  int64_t step_ = 0;
};

TEST_F(SecureShardTest, OnlyWorkersWithACertificateOfTheCaCanPush) {
  StartShard();
  for (const TlsOptions& bad : {certs_->NoCert(), certs_->Rogue(), TlsOptions()}) {
    const absl::Status s = OneStep(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << bad.cert << ": " << s;
    if (bad.enabled()) {
      EXPECT_THAT(std::string(s.message()), HasSubstr("TLS")) << s;
    }
  }
  const absl::Status good = OneStep(certs_->Client());
  EXPECT_TRUE(good.ok()) << good;
}

TEST_F(SecureShardTest, PushesOverTheLayoutsBoundAreRefused) {
  StartShard();
  absl::StatusOr<PsLayout> layout = PsLayout::Create(kN, 1);
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      security::GrpcChannelCredentials(certs_->Client());
  ASSERT_TRUE(credentials.ok());
  grpc::ChannelArguments unbounded;
  unbounded.SetMaxSendMessageSize(-1);
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateCustomChannel(shard_->grpc_address(), *credentials, unbounded));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->Exchange(&context);
  v1::PushChunk push;
  push.set_worker(0);
  push.set_step(1);
  push.set_chunk(0);
  push.set_kind(v1::CHUNK_KIND_FP32);
  push.set_payload(std::string(layout->max_message_bytes() + 1, '\0'));
  stream->Write(push);
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // The shard still serves a worker.
  EXPECT_TRUE(OneStep(certs_->Client()).ok());
}

}  // namespace
}  // namespace onebit
