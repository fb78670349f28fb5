#include "coordinator/membership.h"

#include "absl/strings/str_cat.h"

namespace onebit {

const char* RoleName(v1::Role role) {
  switch (role) {
    case v1::ROLE_WORKER:
      return "worker";
    case v1::ROLE_SERVER:
      return "server";
    default:
      return "unspecified role";
  }
}

Membership::Membership(int world_size, int num_servers, absl::Duration heartbeat_timeout)
    : heartbeat_timeout_(heartbeat_timeout) {
  workers_.slots.resize(world_size);
  servers_.slots.resize(num_servers);
}

Membership::RoleSlots* Membership::Role(v1::Role role) {
  return const_cast<RoleSlots*>(static_cast<const Membership*>(this)->Role(role));
}

const Membership::RoleSlots* Membership::Role(v1::Role role) const {
  switch (role) {
    case v1::ROLE_WORKER:
      return &workers_;
    case v1::ROLE_SERVER:
      return &servers_;
    default:
      return nullptr;
  }
}

namespace {

absl::Status CheckString(const char* field, const std::string& value, bool required) {
  if (required && value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
  }
  if (value.size() > kMaxMemberStringBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", value.size(), " bytes; the limit is ", kMaxMemberStringBytes));
  }
  return absl::OkStatus();
}

absl::Status UnknownRole(int role) {
  return absl::InvalidArgumentError(
      absl::StrCat("role must be ROLE_WORKER or ROLE_SERVER, got ",
                   v1::Role_IsValid(role) ? v1::Role_Name(role) : absl::StrCat(role)));
}

}  // namespace

void Membership::SetHeartbeat(RoleSlots& role, int rank, absl::Time now) {
  Slot& slot = role.slots[rank];
  role.by_heartbeat.erase({slot.last_heartbeat, rank});
  slot.last_heartbeat = now;
  role.by_heartbeat.insert({now, rank});
}

absl::StatusOr<int> Membership::Register(const v1::RegisterRequest& request, absl::Time now) {
  RoleSlots* role = Role(request.role());
  if (role == nullptr) return UnknownRole(request.role());
  std::vector<Slot>* slots = &role->slots;
  absl::Status status = CheckString("instance_id", request.instance_id(), /*required=*/true);
  if (status.ok()) status = CheckString("address", request.address(), false);
  if (status.ok()) status = CheckString("metrics_address", request.metrics_address(), false);
  if (!status.ok()) return status;
  const int size = static_cast<int>(slots->size());
  const int requested = request.requested_rank();
  if (requested < -1 || requested >= size) {
    return absl::InvalidArgumentError(absl::StrCat("requested_rank ", requested,
                                                   " is out of range: -1 (any) or [0, ", size,
                                                   ") for a ", RoleName(request.role())));
  }
  // The same instance again (under either role)?
  if (auto it = by_instance_.find(request.instance_id()); it != by_instance_.end()) {
    const auto [registered_role, registered_rank] = it->second;
    if (registered_role != request.role()) {
      return absl::AlreadyExistsError(
          absl::StrCat("instance '", request.instance_id(), "' is already registered as ",
                       RoleName(registered_role), " ", registered_rank));
    }
    Slot& same = (*slots)[registered_rank];
    same.member.set_address(request.address());
    same.member.set_metrics_address(request.metrics_address());
    SetHeartbeat(*role, registered_rank, now);
    return registered_rank;
  }
  int rank = -1;
  if (requested >= 0 && !(*slots)[requested].registered) {
    rank = requested;
  } else {
    for (int r = 0; r < size; ++r) {
      if (!(*slots)[r].registered) {
        rank = r;
        break;
      }
    }
  }
  if (rank < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("all ", size, " ", RoleName(request.role()),
                                                     " slots are taken (the job config asks for ",
                                                     size, ")"));
  }
  Slot& slot = (*slots)[rank];
  slot.registered = true;
  ++role->registered;
  slot.last_heartbeat = now;
  role->by_heartbeat.insert({now, rank});
  by_instance_[request.instance_id()] = {request.role(), rank};
  slot.member.set_role(request.role());
  slot.member.set_rank(rank);
  slot.member.set_instance_id(request.instance_id());
  slot.member.set_address(request.address());
  slot.member.set_metrics_address(request.metrics_address());
  slot.member.set_last_step(0);
  return rank;
}

absl::Status Membership::CheckMember(v1::Role role, int rank,
                                     const std::string& instance_id) const {
  const RoleSlots* slots = Role(role);
  if (slots == nullptr) return UnknownRole(role);
  if (rank < 0 || rank >= static_cast<int>(slots->slots.size())) {
    return absl::InvalidArgumentError(absl::StrCat(RoleName(role), " rank ", rank,
                                                   " is out of range [0, ", slots->slots.size(),
                                                   ")"));
  }
  const Slot& slot = slots->slots[rank];
  if (!slot.registered) {
    return absl::FailedPreconditionError(
        absl::StrCat(RoleName(role), " rank ", rank, " is not registered; call Register first"));
  }
  if (slot.member.instance_id() != instance_id) {
    return absl::FailedPreconditionError(
        absl::StrCat(RoleName(role), " rank ", rank, " is registered to instance '",
                     slot.member.instance_id(), "', not '", instance_id, "'"));
  }
  return absl::OkStatus();
}

absl::Status Membership::Heartbeat(const v1::Heartbeat& heartbeat, absl::Time now) {
  absl::Status status = CheckMember(heartbeat.role(), heartbeat.rank(), heartbeat.instance_id());
  if (!status.ok()) return status;
  if (heartbeat.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", heartbeat.step()));
  }
  RoleSlots& role = *Role(heartbeat.role());
  SetHeartbeat(role, heartbeat.rank(), now);
  role.slots[heartbeat.rank()].member.set_last_step(heartbeat.step());
  return absl::OkStatus();
}

void Membership::NoteStep(v1::Role role, int rank, int64_t step) {
  RoleSlots* slots = Role(role);
  if (slots == nullptr || rank < 0 || rank >= static_cast<int>(slots->slots.size())) return;
  slots->slots[rank].member.set_last_step(step);
}

bool Membership::IsRegistered(v1::Role role, int rank) const {
  const RoleSlots* slots = Role(role);
  return slots != nullptr && rank >= 0 && rank < static_cast<int>(slots->slots.size()) &&
         slots->slots[rank].registered;
}

bool Membership::IsAlive(v1::Role role, int rank, absl::Time now) const {
  return IsRegistered(role, rank) && IsAlive(Role(role)->slots[rank], now);
}

int Membership::Registered(v1::Role role) const {
  const RoleSlots* slots = Role(role);
  return slots == nullptr ? 0 : slots->registered;
}

bool Membership::IsAlive(const Slot& slot, absl::Time now) const {
  return slot.registered && now - slot.last_heartbeat <= heartbeat_timeout_;
}

int Membership::Alive(v1::Role role, absl::Time now) const {
  const RoleSlots* slots = Role(role);
  if (slots == nullptr) return 0;
  int dead = 0;
  for (const auto& [last, rank] : slots->by_heartbeat) {
    if (now - last <= heartbeat_timeout_) break;  // the rest heard later
    ++dead;
  }
  return slots->registered - dead;
}

std::optional<Membership::Silent> Membership::FirstSilent(absl::Time now,
                                                          int64_t done_step) const {
  std::optional<Silent> first;
  for (v1::Role role : {v1::ROLE_WORKER, v1::ROLE_SERVER}) {
    const RoleSlots& slots = *Role(role);
    for (const auto& [last, rank] : slots.by_heartbeat) {
      if (now - last <= heartbeat_timeout_) break;
      const v1::Member& member = slots.slots[rank].member;
      if (role == v1::ROLE_WORKER && member.last_step() >= done_step) continue;
      if (!first.has_value() || last < first->last_heartbeat) {
        first = Silent{role, rank, member.instance_id(), last};
      }
      break;  // this role's oldest
    }
  }
  return first;
}

std::string Membership::InstanceAt(v1::Role role, int rank) const {
  const RoleSlots* slots = Role(role);
  if (slots == nullptr || rank < 0 || rank >= static_cast<int>(slots->slots.size())) return "";
  const Slot& slot = slots->slots[rank];
  return slot.registered ? slot.member.instance_id() : "";
}

std::vector<v1::Member> Membership::List(absl::Time now) const {
  std::vector<v1::Member> members;
  for (const RoleSlots* slots : {&workers_, &servers_}) {
    for (const Slot& slot : slots->slots) {
      if (!slot.registered) continue;
      v1::Member member = slot.member;
      member.set_alive(IsAlive(slot, now));
      member.set_last_heartbeat_unix_ms(absl::ToUnixMillis(slot.last_heartbeat));
      members.push_back(std::move(member));
    }
  }
  return members;
}

}  // namespace onebit
