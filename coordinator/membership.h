// Who is in the job: workers (ranks 0..W-1) and parameter-server shards (0..S-1), where they
// serve, and whether they are alive. Not thread-safe: the owner serialises calls (see
// Coordinator). Time is passed in, so liveness is testable with a fake clock.
//
// Ranks: a process may ask for a rank (requested_rank >= 0); it gets it if the slot is free,
// else the lowest free slot, so processes that ask for nothing (-1, or proto3's default 0)
// get ranks in arrival order. Registering again with the same instance_id returns the same
// rank (a retry after a lost reply, or a restart that kept its id) and updates the
// addresses. A full role is RESOURCE_EXHAUSTED; slots are not reclaimed from dead members
// (replacing a dead member belongs to failure recovery, which rebuilds the membership).
//
// Liveness: registering counts as a heartbeat; a member is dead once `heartbeat_timeout`
// has passed since its last one, and alive again with the next.
#ifndef ONEBIT_COORDINATOR_MEMBERSHIP_H_
#define ONEBIT_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "onebit/v1/coordinator.pb.h"

namespace onebit {

// Longest instance id and address accepted.
inline constexpr size_t kMaxMemberStringBytes = 256;

class Membership {
 public:
  // world_size >= 1, num_servers >= 0.
  Membership(int world_size, int num_servers, absl::Duration heartbeat_timeout);

  // The rank assigned. Errors: INVALID_ARGUMENT (no role, empty or long id, rank out of
  // range), ALREADY_EXISTS (the id is registered with another role), RESOURCE_EXHAUSTED.
  absl::StatusOr<int> Register(const v1::RegisterRequest& request, absl::Time now);

  // Checks that (role, rank, instance_id) is a registered member and records the
  // heartbeat and its step. FAILED_PRECONDITION if not registered or the id differs.
  absl::Status Heartbeat(const v1::Heartbeat& heartbeat, absl::Time now);
  // Same identity check without recording anything.
  absl::Status CheckMember(v1::Role role, int rank, const std::string& instance_id) const;
  // The member's last reported step (stats reports carry no instance id).
  void NoteStep(v1::Role role, int rank, int64_t step);

  bool IsRegistered(v1::Role role, int rank) const;
  // The instance id registered in that slot; "" if it is free (or out of range).
  std::string InstanceAt(v1::Role role, int rank) const;
  int Registered(v1::Role role) const;
  int Alive(v1::Role role, absl::Time now) const;
  // Workers by rank, then servers by shard.
  std::vector<v1::Member> List(absl::Time now) const;

  int world_size() const { return static_cast<int>(workers_.size()); }
  int num_servers() const { return static_cast<int>(servers_.size()); }

 private:
  struct Slot {
    bool registered = false;
    v1::Member member;  // role, rank, instance_id, addresses, last_step
    absl::Time last_heartbeat = absl::InfinitePast();
  };

  std::vector<Slot>* Slots(v1::Role role);
  const std::vector<Slot>* Slots(v1::Role role) const;
  bool IsAlive(const Slot& slot, absl::Time now) const;

  std::vector<Slot> workers_;
  std::vector<Slot> servers_;
  absl::Duration heartbeat_timeout_;
};

// "worker" / "server" / "unspecified role".
const char* RoleName(v1::Role role);

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_MEMBERSHIP_H_
