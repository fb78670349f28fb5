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
//
// Cost: every call but List is O(log N) or O(1) plus O(members dead now) (each role's
// registered slots are also kept ordered by their last heartbeat, and counted), so that a
// coordinator of 1,024 members does not scan them all on each heartbeat.
#ifndef ONEBIT_COORDINATOR_MEMBERSHIP_H_
#define ONEBIT_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
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
  // Registered and heard from within the timeout.
  bool IsAlive(v1::Role role, int rank, absl::Time now) const;
  // The instance id registered in that slot; "" if it is free (or out of range).
  std::string InstanceAt(v1::Role role, int rank) const;
  int Registered(v1::Role role) const;
  int Alive(v1::Role role, absl::Time now) const;
  // Workers by rank, then servers by shard.
  std::vector<v1::Member> List(absl::Time now) const;

  // The registered member whose heartbeats stopped first among those dead at `now`, not
  // counting workers whose last step is >= `done_step` (they ran the job's last step and
  // may be gone). Ties: workers before servers, lower ranks first.
  struct Silent {
    v1::Role role;
    int rank;
    std::string instance_id;
    absl::Time last_heartbeat;
  };
  std::optional<Silent> FirstSilent(absl::Time now, int64_t done_step) const;

  int world_size() const { return static_cast<int>(workers_.slots.size()); }
  int num_servers() const { return static_cast<int>(servers_.slots.size()); }

 private:
  struct Slot {
    bool registered = false;
    v1::Member member;  // role, rank, instance_id, addresses, last_step
    absl::Time last_heartbeat = absl::InfinitePast();
  };

  // Per role: its slots, how many are registered, and the registered ranks ordered by
  // their last heartbeat (oldest first).
  struct RoleSlots {
    std::vector<Slot> slots;
    int registered = 0;
    std::set<std::pair<absl::Time, int>> by_heartbeat;
  };

  RoleSlots* Role(v1::Role role);
  const RoleSlots* Role(v1::Role role) const;
  bool IsAlive(const Slot& slot, absl::Time now) const;
  // Moves a registered slot's heartbeat (keeps by_heartbeat in step).
  void SetHeartbeat(RoleSlots& role, int rank, absl::Time now);

  RoleSlots workers_;
  RoleSlots servers_;
  absl::flat_hash_map<std::string, std::pair<v1::Role, int>> by_instance_;
  absl::Duration heartbeat_timeout_;
};

// "worker" / "server" / "unspecified role".
const char* RoleName(v1::Role role);

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_MEMBERSHIP_H_
