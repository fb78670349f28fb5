#include "server/shard_checkpointer.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "checkpoint/part.h"
#include "common/status_macros.h"

namespace onebit::server {

ShardCheckpointer::ShardCheckpointer(std::string dir, int index, std::string topology)
    : dir_(std::move(dir)), index_(index), topology_(std::move(topology)) {
  thread_ = std::thread([this] { Run(); });
}

ShardCheckpointer::~ShardCheckpointer() { Finish(kFinishBudget); }

int ShardCheckpointer::Finish(absl::Duration budget) {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (!mu_.AwaitWithTimeout(absl::Condition(&done_), budget)) {
      cancelled_ = true;
      if (client_ != nullptr) client_->Cancel();
    }
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void ShardCheckpointer::Enqueue(int64_t step, std::vector<float> server_error) {
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(step, std::move(server_error));
}

void ShardCheckpointer::Start(CoordinatorClient* client, std::string instance_id) {
  absl::MutexLock lock(&mu_);
  client_ = client;
  instance_id_ = std::move(instance_id);
}

absl::Status ShardCheckpointer::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void ShardCheckpointer::Run() {
  for (;;) {
    std::pair<int64_t, std::vector<float>> item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (client_ != nullptr && !queue_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      // Stopping drains what can be written in Finish's time; without a client nothing
      // can be reported.
      if (queue_.empty() || client_ == nullptr || cancelled_) {
        dropped_ = static_cast<int>(queue_.size());
        if (dropped_ > 0) {
          std::fprintf(stderr, "onebit-server: shard %d: stopping; %d checkpoint part(s) from "
                       "step %lld on not written\n", index_, dropped_,
                       static_cast<long long>(queue_.front().first));
        }
        queue_.clear();
        done_ = true;
        return;
      }
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    const absl::Status status = Write(item.first, std::move(item.second));
    if (!status.ok()) {
      std::fprintf(stderr, "onebit-server: shard %d: checkpoint of step %lld failed: %s\n", index_,
                   static_cast<long long>(item.first), std::string(status.message()).c_str());
      absl::MutexLock lock(&mu_);
      if (status_.ok()) status_ = status;
    }
  }
}

absl::Status ShardCheckpointer::Write(int64_t step, std::vector<float> server_error) {
  checkpoint::Part part;
  part.meta["role"] = "server";
  part.meta["topology"] = topology_;
  part.PutMetaInt("step", step);
  part.PutMetaInt("rank", index_);
  part.Put("server_error", std::move(server_error));
  ONEBIT_ASSIGN_OR_RETURN(std::string dir, checkpoint::MakeStepDir(dir_, step));
  const std::string file = checkpoint::PartFileName(v1::ROLE_SERVER, index_);
  ONEBIT_ASSIGN_OR_RETURN(checkpoint::WrittenFile written,
                          checkpoint::WritePart(checkpoint::JoinPath(dir, file), part));
  v1::CommitPartRequest request;
  CoordinatorClient* client;
  {
    absl::MutexLock lock(&mu_);
    client = client_;
    request.set_instance_id(instance_id_);
  }
  request.set_step(step);
  v1::CheckpointPart* p = request.mutable_part();
  p->set_role(v1::ROLE_SERVER);
  p->set_rank(index_);
  p->set_file(file);
  p->set_bytes(written.bytes);
  p->set_crc32(written.crc32);
  return client->CommitPart(request).status();
}

absl::Status ShardCheckpointer::Restore(const std::string& root, const v1::ResumeFrom& resume,
                                        int index, ShardState& state) {
  const std::string path =
      checkpoint::JoinPath(checkpoint::JoinPath(root, checkpoint::StepDirName(resume.step())),
                           checkpoint::PartFileName(v1::ROLE_SERVER, index));
  ONEBIT_ASSIGN_OR_RETURN(checkpoint::Part part, checkpoint::ReadPart(path));
  ONEBIT_ASSIGN_OR_RETURN(int64_t step, part.MetaInt("step"));
  if (step != resume.step()) {
    return absl::DataLossError(absl::StrCat(path, ": step ", step, ", expected ", resume.step()));
  }
  ONEBIT_ASSIGN_OR_RETURN(const checkpoint::Tensor* error, part.Get("server_error"));
  absl::Status restored = state.RestoreServerError(error->data);
  if (!restored.ok()) return absl::Status(restored.code(), absl::StrCat(path, ": ", restored.message()));
  return absl::OkStatus();
}

}  // namespace onebit::server
