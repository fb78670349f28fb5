#include "worker/exchange/ps_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/exchange_wire.h"
#include "proto/grpc_status.h"
#include "security/tls.h"

namespace onebit {
namespace {

enum OpType { kWrite = 0, kRead, kFinish, kNumOps };

// Codes after which the same push is tried again on a new stream: the shard or the
// connection went away (or was too busy), not the push itself. A rejection of the push
// (INVALID_ARGUMENT, FAILED_PRECONDITION, ALREADY_EXISTS, ...) would only be rejected again.
bool Retryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return true;
    default:
      return false;
  }
}

// The host part of "host:port" ("[v6]:port" too).
absl::string_view HostOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// push_order empty or a permutation of [0, num_shards); local_shards in [0, num_shards).
absl::Status ValidatePushPlan(const PsExchangeOptions& options, size_t num_shards) {
  if (!options.push_order.empty()) {
    std::vector<int> sorted = options.push_order;
    std::sort(sorted.begin(), sorted.end());
    bool permutation = sorted.size() == num_shards;
    for (size_t s = 0; permutation && s < sorted.size(); ++s) {
      permutation = sorted[s] == static_cast<int>(s);
    }
    if (!permutation) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PsExchangeOptions: push_order must be a permutation of the ", num_shards,
          " shards, got [", absl::StrJoin(options.push_order, ", "), "]"));
    }
  }
  for (int s : options.local_shards) {
    if (s < 0 || static_cast<size_t>(s) >= num_shards) {
      return absl::InvalidArgumentError(
          absl::StrCat("PsExchangeOptions: local shard ", s, " is not one of the ", num_shards));
    }
  }
  return absl::OkStatus();
}

}  // namespace

PushPlan PlanPushes(const std::string& host, const std::vector<std::string>& shard_addresses) {
  std::vector<std::string> hosts;               // in order of first appearance
  std::vector<std::vector<int>> shards_of;      // by host
  for (size_t s = 0; s < shard_addresses.size(); ++s) {
    const std::string h(HostOf(shard_addresses[s]));
    const size_t index = std::find(hosts.begin(), hosts.end(), h) - hosts.begin();
    if (index == hosts.size()) {
      hosts.push_back(h);
      shards_of.emplace_back();
    }
    shards_of[index].push_back(static_cast<int>(s));
  }
  const int num_hosts = static_cast<int>(hosts.size());
  int own = -1;
  if (!host.empty()) {
    const auto it = std::find(hosts.begin(), hosts.end(), host);
    if (it != hosts.end()) own = static_cast<int>(it - hosts.begin());
  }
  size_t parts = 0;
  for (const auto& shards : shards_of) parts = std::max(parts, shards.size());
  PushPlan plan;
  for (size_t part = 0; part < parts; ++part) {
    for (int k = 0; k < num_hosts; ++k) {
      const int h = own >= 0 ? (own + 1 + k) % num_hosts : k;
      if (part < shards_of[h].size()) plan.order.push_back(shards_of[h][part]);
    }
  }
  if (own >= 0) plan.local = shards_of[own];
  return plan;
}

struct PsExchange::Op {
  Shard* shard;
  int type;  // OpType
};

struct PsExchange::Shard {
  int index = 0;
  std::string name;  // "shard 1 (host:port)", for messages
  std::shared_ptr<grpc::Channel> channel;
  // ParameterServer.Exchange over raw messages (proto/exchange_wire.h).
  std::unique_ptr<grpc::GenericStub> stub;
  // The open stream, if any.
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream;
  Op ops[kNumOps];
  bool pending[kNumOps] = {};
  bool broken = false;  // to be finished and reopened
  grpc::Status finish_status;
  // The push of the current call: the encoded message (its payload one copy of the
  // caller's bytes, shared by every attempt) and the payload's size.
  grpc::ByteBuffer push;
  size_t push_payload_bytes = 0;
  // Buffers of the pushes' payloads, send_bytes each (PayloadSlice).
  std::vector<std::shared_ptr<char[]>> send;
  size_t send_bytes = 0;
  // The raw result as read, and its fields (the payload by reference to its slices).
  grpc::ByteBuffer raw_result;
  wire::ResultFields result;
  // The current call.
  bool done = false;
  int attempts = 0;
  absl::Time retry_at = absl::InfinitePast();
  absl::Status last_error;  // why the last attempt failed
  absl::Status fatal;       // a failure that ends the call
  // The attempt's write, for the trace: when it was issued and when it completed.
  absl::Time write_start = absl::InfinitePast();
  absl::Time write_end = absl::InfinitePast();
};

grpc::ChannelArguments PsExchange::ChannelArguments(const PsLayout& layout,
                                                    const security::TlsOptions& tls) {
  grpc::ChannelArguments args;
  const int max_message =
      static_cast<int>(std::min<size_t>(layout.max_message_bytes(), INT32_MAX));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC takes this as the connect timeout too (TCP plus the HTTP/2 SETTINGS frame). A
  // dead shard refuses at once whatever it is, so it only has to outlast a slow peer: at
  // 100 ms, shards on a loaded machine (sanitizers, load 20 on 2 cores) were given up on.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, security::ConnectTimeoutMs(tls, 2000));
  security::AddTlsChannelArguments(tls, &args);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Workers in one process (tests, local runs) should not share a connection, as real
  // workers on different hosts do not.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

absl::StatusOr<std::unique_ptr<PsExchange>> PsExchange::Create(
    kernels::Backend* backend, int rank, int world_size, size_t n,
    const std::vector<std::string>& shard_addresses, const PsExchangeOptions& options) {
  if (shard_addresses.empty()) return absl::InvalidArgumentError("ps mode needs at least one shard");
  ONEBIT_ASSIGN_OR_RETURN(
      PsLayout layout,
      PsLayout::Create(n, static_cast<int>(shard_addresses.size()), *options.codec));
  ONEBIT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                          security::GrpcChannelCredentials(options.tls));
  const grpc::ChannelArguments args = ChannelArguments(layout, options.tls);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& address : shard_addresses) {
    channels.push_back(grpc::CreateCustomChannel(address, credentials, args));
  }
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PsExchange> exchange,
                          Create(backend, rank, world_size, n, std::move(channels), options));
  for (size_t s = 0; s < shard_addresses.size(); ++s) {
    exchange->shards_[s]->name = absl::StrCat("shard ", s, " (", shard_addresses[s], ")");
  }
  return exchange;
}

absl::StatusOr<std::unique_ptr<PsExchange>> PsExchange::Create(
    kernels::Backend* backend, int rank, int world_size, size_t n,
    std::vector<std::shared_ptr<grpc::Channel>> channels, const PsExchangeOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", world_size, ")"));
  }
  if (channels.empty()) return absl::InvalidArgumentError("ps mode needs at least one shard");
  for (const auto& channel : channels) {
    if (channel == nullptr) return absl::InvalidArgumentError("null channel");
  }
  if (options.max_attempts < 1 || options.step_deadline <= absl::ZeroDuration() ||
      options.retry_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "PsExchangeOptions: max_attempts must be >= 1, step_deadline > 0, retry_backoff >= 0");
  }
  ONEBIT_RETURN_IF_ERROR(ValidatePushPlan(options, channels.size()));
  ONEBIT_ASSIGN_OR_RETURN(
      PsLayout layout, PsLayout::Create(n, static_cast<int>(channels.size()), *options.codec));
  std::unique_ptr<PsExchange> exchange(new PsExchange(backend, rank, world_size, layout, options));
  ONEBIT_RETURN_IF_ERROR(exchange->Init(std::move(channels)));
  return exchange;
}

PsExchange::PsExchange(kernels::Backend* backend, int rank, int world_size,
                       const PsLayout& layout, const PsExchangeOptions& options)
    : backend_(backend),
      rank_(rank),
      world_size_(world_size),
      layout_(layout),
      options_(options),
      result_stage_(backend) {}

absl::Status PsExchange::Init(std::vector<std::shared_ptr<grpc::Channel>> channels) {
  const size_t num_shards = static_cast<size_t>(layout_.num_shards());
  push_order_ = options_.push_order;
  if (push_order_.empty()) {
    for (size_t s = 0; s < num_shards; ++s) push_order_.push_back(static_cast<int>(s));
  }
  local_shard_.assign(num_shards, false);
  for (int s : options_.local_shards) local_shard_[s] = true;
  ONEBIT_ASSIGN_OR_RETURN(compressor_,
                          WorkerCompressor::Create(backend_, layout_.n(), num_shards,
                                                   layout_.chunk(), layout_.codec()));
  using kernels::Buffer;
  ONEBIT_ASSIGN_OR_RETURN(blocks_,
                          Buffer<uint8_t>::Create(backend_, num_shards * layout_.block_bytes()));
  ONEBIT_ASSIGN_OR_RETURN(gathered_,
                          Buffer<uint8_t>::Create(backend_, num_shards * layout_.block_bytes()));
  cq_ = std::make_unique<grpc::CompletionQueue>();
  for (size_t s = 0; s < num_shards; ++s) {
    auto shard = std::make_unique<Shard>();
    shard->index = static_cast<int>(s);
    shard->name = absl::StrCat("shard ", s);
    shard->channel = std::move(channels[s]);
    shard->stub = std::make_unique<grpc::GenericStub>(shard->channel);
    for (int t = 0; t < kNumOps; ++t) shard->ops[t] = Op{shard.get(), t};
    shards_.push_back(std::move(shard));
  }
  return absl::OkStatus();
}

PsExchange::~PsExchange() {
  // Close every stream (the shards see a cancelled stream and stop waiting for it), then
  // empty the queue: gRPC requires both before the objects go.
  for (auto& shard : shards_) {
    if (shard->stream == nullptr) continue;
    shard->context->TryCancel();
    shard->broken = true;
    FinishIfBroken(*shard);
  }
  CancelAndDrain();
  cq_->Shutdown();
  void* tag;
  bool ok;
  while (cq_->Next(&tag, &ok)) {
  }
}

absl::StatusOr<const float*> PsExchange::SumGradients(int64_t step, const float* grad) {
  // Made on the first warmup sum: a job whose warmup goes between the workers
  // (WorkersWarmupExchange) never needs these 4n bytes.
  if (sum_.size() == 0) {
    ONEBIT_ASSIGN_OR_RETURN(sum_, kernels::Buffer<float>::Create(backend_, layout_.n()));
  }
  for (auto& shard : shards_) {
    const int s = shard->index;
    // One copy of the run into a slice gRPC owns (it may hold it past this call); the
    // message around it is a few header bytes, not a second copy.
    ONEBIT_ASSIGN_OR_RETURN(grpc::Slice payload,
                            PayloadSlice(*shard, grad + layout_.fp32_offset(s),
                                         layout_.fp32_count(s) * sizeof(float)));
    SetPush(*shard, step, ChunkKind::kFp32, payload);
  }
  ONEBIT_RETURN_IF_ERROR(RoundTrip(step, ChunkKind::kFp32));
  ONEBIT_RETURN_IF_ERROR(CopyResults(sum_.data(), layout_.n() * sizeof(float), [&](int s) {
    return layout_.fp32_offset(s) * sizeof(float);
  }));
  return sum_.data();
}

absl::StatusOr<CompressedResult> PsExchange::AverageMomentum(int64_t step, const float* m,
                                                             const float* g, float beta1) {
  // A call retried after a failure pushes the blocks it already made: compressing again
  // would move the worker error a second time and the shard would see a different payload.
  if (step != failed_step_) {
    ScopedStepTime time(step_clock(), &compress_seconds_);
    ONEBIT_RETURN_IF_ERROR(compressor_->Compress(m, g, beta1, blocks_.data()));
    ONEBIT_RETURN_IF_ERROR(FinishTimedDeviceWork(step_clock(), backend_));
  }
  failed_step_ = step;
  const size_t block = layout_.block_bytes();
  for (auto& shard : shards_) {
    ONEBIT_ASSIGN_OR_RETURN(grpc::Slice payload,
                            PayloadSlice(*shard, blocks_.data() + shard->index * block, block));
    SetPush(*shard, step, ChunkKind::kOnebit, payload);
  }
  ONEBIT_RETURN_IF_ERROR(RoundTrip(step, ChunkKind::kOnebit));
  failed_step_ = 0;
  ONEBIT_RETURN_IF_ERROR(CopyResults(gathered_.data(), gathered_.bytes(),
                                     [block](int s) { return s * block; }));
  return CompressedResult{&layout_.codec(), gathered_.data(), shards_.size(), layout_.chunk()};
}

absl::StatusOr<CompressedResult> PsExchange::CompressedAverage(int64_t step, const float* x) {
  // Without a gradient the compressor takes its input as it is.
  return AverageMomentum(step, x, nullptr, 0.0f);
}

absl::Status PsExchange::ResetErrors(int64_t step) {
  // The shards zero theirs when they aggregate `step` (its pushes carry the flag).
  reset_step_ = step;
  return compressor_->ResetError();
}

absl::StatusOr<bool> PsExchange::AnyOverflow(int64_t step, bool local_overflow) {
  // Shard 0 is where the workers meet. A vote is idempotent, so a failed call is retried.
  if (agree_stub_ == nullptr) agree_stub_ = v1::ParameterServer::NewStub(shards_[0]->channel);
  v1::OverflowVote vote;
  vote.set_worker(rank_);
  vote.set_step(step);
  vote.set_overflow(local_overflow);
  const absl::Time deadline = absl::Now() + options_.step_deadline;
  absl::Duration backoff = options_.retry_backoff;
  absl::Status last;
  for (int attempt = 0; attempt < options_.max_attempts && absl::Now() < deadline; ++attempt) {
    if (attempt > 0) {
      absl::SleepFor(std::min(backoff, deadline - absl::Now()));
      backoff *= 2;
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::OverflowAgreement agreement;
    last = FromGrpcStatus(agree_stub_->AgreeOverflow(&context, vote, &agreement));
    if (last.ok()) {
      if (agreement.step() != step) {
        return absl::InternalError(absl::StrCat(shards_[0]->name, " answered the overflow vote of ",
                                                "step ", agreement.step(), " for step ", step));
      }
      return agreement.any_overflow();
    }
    if (last.code() == absl::StatusCode::kDeadlineExceeded) {
      last = absl::UnavailableError(absl::StrCat("no agreement within ",
                                                 absl::FormatDuration(options_.step_deadline)));
    }
    if (last.code() != absl::StatusCode::kUnavailable) break;  // a rejection: as it came
  }
  return absl::Status(last.code(), absl::StrCat(shards_[0]->name, ", overflow vote of step ",
                                                step, ": ", last.message()));
}

absl::Status PsExchange::CopyResults(void* dst, size_t bytes,
                                      const std::function<size_t(int)>& offset) {
  const bool host = backend_->memory_space() == kernels::MemorySpace::kHost;
  char* to = static_cast<char*>(dst);
  if (!host) {
    absl::StatusOr<void*> stage = result_stage_.Reserve(bytes);
    if (!stage.ok()) {
      ReleaseResults();
      return stage.status();
    }
    to = static_cast<char*>(*stage);
  }
  // Straight from the received slices: the one copy on this side (and, on a device, the
  // one copy up from the pinned stage).
  for (auto& shard : shards_) wire::CopyTo(shard->result.payload, to + offset(shard->index));
  ReleaseResults();
  if (host || bytes == 0) return absl::OkStatus();
  return backend_->CopyFromHost(dst, to, bytes);
}

absl::StatusOr<grpc::Slice> PsExchange::PayloadSlice(Shard& shard, const void* data,
                                                     size_t bytes) {
  shard.push.Clear();  // the last push's reference
  // A buffer of an earlier step that gRPC let go of (no slice refers to it any more), so
  // that its memory is mapped already: a fresh run-sized allocation per step costs more in
  // page faults than the copy itself. gRPC may hold the last push's slices for a while
  // after the write completed, hence a few buffers; none free: a new one (not zeroed).
  constexpr size_t kMaxBuffers = 3;
  if (shard.send_bytes != bytes) {
    shard.send.clear();
    shard.send_bytes = bytes;
  }
  std::shared_ptr<char[]> buffer;
  for (const auto& b : shard.send) {
    if (b.use_count() == 1) {
      buffer = b;
      break;
    }
  }
  if (buffer == nullptr) {
    // The backend's staging memory (pinned on a GPU), freed by whoever lets go last.
    ONEBIT_ASSIGN_OR_RETURN(void* memory, backend_->AllocateHost(bytes));
    kernels::Backend* backend = backend_;
    buffer = std::shared_ptr<char[]>(static_cast<char*>(memory),
                                     [backend](char* p) { backend->FreeHost(p); });
    if (shard.send.size() >= kMaxBuffers) shard.send.erase(shard.send.begin());
    shard.send.push_back(buffer);
  }
  // From the backend's memory: a memcpy on the CPU, the copy down on a GPU.
  if (bytes > 0) ONEBIT_RETURN_IF_ERROR(backend_->CopyToHost(buffer.get(), data, bytes));
  const char* start = buffer.get();
  return wire::OwnedSlice(std::move(buffer), start, bytes);
}

void PsExchange::SetPush(Shard& shard, int64_t step, ChunkKind kind, const grpc::Slice& payload) {
  shard.push = wire::EncodePush(rank_, step, shard.index, static_cast<int32_t>(kind),
                                step == checkpoint_step_, payload, step == reset_step_);
  shard.push_payload_bytes = payload.size();
}

void PsExchange::ReleaseResults() {
  for (auto& shard : shards_) {
    shard->push.Clear();
    shard->raw_result.Clear();
    shard->result = wire::ResultFields();
  }
}

bool PsExchange::Busy(const Shard& shard) const {
  return std::any_of(std::begin(shard.pending), std::end(shard.pending), [](bool p) { return p; });
}

void PsExchange::StartAttempt(Shard& shard) {
  ++shard.attempts;
  if (shard.stream == nullptr) {
    shard.context = std::make_unique<grpc::ClientContext>();
    // Corked: the call's metadata leaves with the first push, and StartCall queues no
    // operation of its own (it would share the write slot with that push).
    shard.context->set_initial_metadata_corked(true);
    shard.stream = shard.stub->PrepareCall(shard.context.get(), wire::kExchangeMethod, cq_.get());
    shard.broken = false;
    shard.stream->StartCall(nullptr);
  }
  if (options_.trace != nullptr) {
    shard.write_start = options_.trace->now();
    shard.write_end = absl::InfinitePast();
  }
  shard.pending[kWrite] = true;
  shard.stream->Write(shard.push, &shard.ops[kWrite]);
  shard.pending[kRead] = true;
  shard.stream->Read(&shard.raw_result, &shard.ops[kRead]);
}

void PsExchange::FinishIfBroken(Shard& shard) {
  if (!shard.broken || shard.stream == nullptr || Busy(shard)) return;
  shard.pending[kFinish] = true;
  shard.stream->Finish(&shard.finish_status, &shard.ops[kFinish]);
}

absl::Status PsExchange::ValidateResult(const Shard& shard, int64_t step, ChunkKind kind) const {
  const wire::ResultFields& r = shard.result;
  if (r.step != step || r.chunk != shard.index || r.kind != static_cast<int>(kind)) {
    return absl::InternalError(absl::StrCat(shard.name, " answered step ", r.step, ", chunk ",
                                            r.chunk, ", kind ", r.kind, " to a push of step ",
                                            step, ", chunk ", shard.index, ", kind ",
                                            static_cast<int>(kind)));
  }
  const size_t expected = layout_.payload_bytes(kind, shard.index);
  if (r.payload.size() != expected) {
    return absl::InternalError(absl::StrCat(shard.name, " sent a ", ChunkKindName(kind),
                                            " result of ", r.payload.size(), " bytes, expected ",
                                            expected));
  }
  if (kind == ChunkKind::kOnebit) {
    const Codec& codec = layout_.codec();
    std::vector<uint8_t> header(codec.header_bytes());
    wire::CopyTo(r.payload.Subcord(0, header.size()), header.data());
    if (const std::optional<HeaderFault> fault = codec.CheckHeader(header.data())) {
      return absl::InternalError(absl::StrCat(shard.name, " sent a result block with ",
                                              fault->field, " ", fault->value, " (",
                                              codec.name(), ")"));
    }
  }
  return absl::OkStatus();
}

void PsExchange::TraceResult(const Shard& shard, size_t bytes, bool ok) {
  if (options_.trace == nullptr) return;
  const absl::Time start =
      shard.write_end == absl::InfinitePast() ? shard.write_start : shard.write_end;
  options_.trace->Write(
      CallLine{"Result", -1, shard.index, bytes, 0, bytes, start, options_.trace->now(), ok});
}

void PsExchange::HandleEvent(Op& op, bool ok, int64_t step, ChunkKind kind) {
  Shard& shard = *op.shard;
  shard.pending[op.type] = false;
  switch (op.type) {
    case kWrite:
      if (ok) {
        bytes_sent_ += shard.push_payload_bytes;
      } else {
        shard.broken = true;  // the read fails too and the status tells why
      }
      if (options_.trace != nullptr) {
        shard.write_end = options_.trace->now();
        options_.trace->Write(CallLine{"Push", shard.index, -1, shard.push_payload_bytes,
                                       shard.push_payload_bytes, 0, shard.write_start,
                                       shard.write_end, ok});
      }
      break;
    case kRead: {
      if (!ok) {
        TraceResult(shard, 0, false);
        shard.broken = true;
        break;
      }
      absl::Status valid;
      absl::StatusOr<wire::ResultFields> parsed =
          wire::ParseResult(wire::ToCord(shard.raw_result));
      shard.raw_result.Clear();  // the payload's slices live on in the parsed fields only
      if (parsed.ok()) {
        shard.result = *std::move(parsed);
        bytes_received_ += shard.result.payload.size();
        valid = ValidateResult(shard, step, kind);
      } else {
        valid = absl::InternalError(absl::StrCat(shard.name, ": ", parsed.status().message()));
      }
      TraceResult(shard, valid.ok() ? shard.result.payload.size() : 0, valid.ok());
      if (valid.ok()) {
        shard.done = true;
      } else {
        // The stream itself is fine but cannot be trusted: drop it.
        shard.fatal = valid;
        shard.context->TryCancel();
        shard.broken = true;
      }
      break;
    }
    case kFinish: {
      const grpc::Status status = shard.finish_status;
      shard.stream.reset();
      shard.context.reset();
      shard.broken = false;
      if (shard.done || !shard.fatal.ok()) break;
      const absl::Status error = status.ok() ? absl::UnavailableError("the shard closed the stream")
                                             : FromGrpcStatus(status);
      const std::string message = absl::StrCat(shard.name, ": ", error.message());
      if (status.ok() || Retryable(status.error_code())) {
        shard.last_error = absl::Status(error.code(), message);
        shard.retry_at =
            absl::Now() + options_.retry_backoff * (1 << std::min(shard.attempts - 1, 16));
      } else {
        shard.fatal = absl::Status(error.code(), message);
      }
      break;
    }
  }
  FinishIfBroken(shard);
}

absl::Status PsExchange::RoundTrip(int64_t step, ChunkKind kind) {
  const absl::Time deadline = absl::Now() + options_.step_deadline;
  for (auto& shard : shards_) {
    shard->done = false;
    shard->attempts = 0;
    shard->retry_at = absl::InfinitePast();
    shard->last_error = absl::OkStatus();
    shard->fatal = absl::OkStatus();
  }
  // Large pushes go out one shard after another in push_order_ (see the header): with
  // shards apart, every worker pushes shard 0 first, so shard 0's result comes down while
  // shard 1's push goes up; with shards on the workers' hosts, each worker starts after its
  // own host, so no host's link takes every worker's push at once. A shard on this host
  // takes no link: its push goes at once.
  const bool staggered =
      std::any_of(shards_.begin(), shards_.end(), [this](const auto& shard) {
        return shard->push_payload_bytes >= options_.stagger_min_bytes;
      }) &&
      options_.stagger_min_bytes > 0;
  while (true) {
    const absl::Time now = absl::Now();
    absl::Time wake = deadline;
    bool finished = true;
    // Whether every shard before this one has had its first push written (or is done).
    bool earlier_written = true;
    for (size_t k = 0; k < shards_.size(); ++k) {
      Shard& shard = *shards_[push_order_[k]];
      const bool may_start = !staggered || earlier_written || local_shard_[shard.index];
      earlier_written = earlier_written &&
                        (shard.done || (shard.attempts > 0 && !shard.pending[kWrite]));
      if (!shard.fatal.ok()) {
        CancelAndDrain();
        return shard.fatal;
      }
      if (shard.done && !Busy(shard)) continue;
      finished = false;
      if (shard.done || Busy(shard)) continue;
      if (shard.attempts >= options_.max_attempts) {
        CancelAndDrain();
        return absl::UnavailableError(absl::StrCat(
            "step ", step, " failed after ", shard.attempts, " attempts: ",
            shard.last_error.message(),
            shard.last_error.code() == absl::StatusCode::kUnavailable
                ? security::HandshakeHint(options_.tls)
                : std::string()));
      }
      if (now < shard.retry_at) {
        wake = std::min(wake, shard.retry_at);
        continue;
      }
      if (shard.attempts == 0 && !may_start) continue;  // a write completion wakes us
      StartAttempt(shard);
    }
    if (finished) return absl::OkStatus();
    if (now >= deadline) {
      std::vector<std::string> missing;
      for (auto& shard : shards_) {
        if (!shard->done) missing.push_back(shard->name);
      }
      CancelAndDrain();
      return absl::UnavailableError(absl::StrCat("no result for step ", step, " within ",
                                                 absl::FormatDuration(options_.step_deadline),
                                                 " from ", absl::StrJoin(missing, ", ")));
    }
    void* tag = nullptr;
    bool ok = false;
    switch (cq_->AsyncNext(&tag, &ok, absl::ToChronoTime(wake))) {
      case grpc::CompletionQueue::GOT_EVENT:
        HandleEvent(*static_cast<Op*>(tag), ok, step, kind);
        break;
      case grpc::CompletionQueue::TIMEOUT:
        break;
      case grpc::CompletionQueue::SHUTDOWN:
        return absl::InternalError("completion queue shut down");
    }
  }
}

void PsExchange::CancelAndDrain() {
  for (auto& shard : shards_) {
    if (!Busy(*shard)) continue;
    shard->context->TryCancel();
    shard->broken = true;
  }
  // After TryCancel every operation completes promptly, so this wait is bounded.
  while (std::any_of(shards_.begin(), shards_.end(), [this](const auto& s) { return Busy(*s); })) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq_->Next(&tag, &ok)) return;
    Op& op = *static_cast<Op*>(tag);
    Shard& shard = *op.shard;
    shard.pending[op.type] = false;
    if (op.type == kWrite && ok) bytes_sent_ += shard.push_payload_bytes;
    if (op.type == kRead && ok) {
      // A result that came after all: counted, not used.
      absl::StatusOr<wire::ResultFields> parsed =
          wire::ParseResult(wire::ToCord(shard.raw_result));
      if (parsed.ok()) bytes_received_ += parsed->payload.size();
      shard.raw_result.Clear();
    }
    if (op.type == kFinish) {
      shard.stream.reset();
      shard.context.reset();
      shard.broken = false;
    }
    FinishIfBroken(shard);
  }
}

}  // namespace onebit
