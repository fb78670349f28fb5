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
    : workers_(world_size), servers_(num_servers), heartbeat_timeout_(heartbeat_timeout) {}

std::vector<Membership::Slot>* Membership::Slots(v1::Role role) {
  return const_cast<std::vector<Slot>*>(static_cast<const Membership*>(this)->Slots(role));
}

const std::vector<Membership::Slot>* Membership::Slots(v1::Role role) const {
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

absl::StatusOr<int> Membership::Register(const v1::RegisterRequest& request, absl::Time now) {
  std::vector<Slot>* slots = Slots(request.role());
  if (slots == nullptr) return UnknownRole(request.role());
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
  for (const std::vector<Slot>* role_slots : {&workers_, &servers_}) {
    for (const Slot& slot : *role_slots) {
      if (!slot.registered || slot.member.instance_id() != request.instance_id()) continue;
      if (slot.member.role() != request.role()) {
        return absl::AlreadyExistsError(
            absl::StrCat("instance '", request.instance_id(), "' is already registered as ",
                         RoleName(slot.member.role()), " ", slot.member.rank()));
      }
      Slot& same = (*slots)[slot.member.rank()];
      same.member.set_address(request.address());
      same.member.set_metrics_address(request.metrics_address());
      same.last_heartbeat = now;
      return same.member.rank();
    }
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
  slot.last_heartbeat = now;
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
  const std::vector<Slot>* slots = Slots(role);
  if (slots == nullptr) return UnknownRole(role);
  if (rank < 0 || rank >= static_cast<int>(slots->size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(RoleName(role), " rank ", rank, " is out of range [0, ", slots->size(), ")"));
  }
  const Slot& slot = (*slots)[rank];
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
  Slot& slot = (*Slots(heartbeat.role()))[heartbeat.rank()];
  slot.last_heartbeat = now;
  slot.member.set_last_step(heartbeat.step());
  return absl::OkStatus();
}

void Membership::NoteStep(v1::Role role, int rank, int64_t step) {
  std::vector<Slot>* slots = Slots(role);
  if (slots == nullptr || rank < 0 || rank >= static_cast<int>(slots->size())) return;
  (*slots)[rank].member.set_last_step(step);
}

bool Membership::IsRegistered(v1::Role role, int rank) const {
  const std::vector<Slot>* slots = Slots(role);
  return slots != nullptr && rank >= 0 && rank < static_cast<int>(slots->size()) &&
         (*slots)[rank].registered;
}

int Membership::Registered(v1::Role role) const {
  const std::vector<Slot>* slots = Slots(role);
  int n = 0;
  if (slots != nullptr) {
    for (const Slot& slot : *slots) n += slot.registered ? 1 : 0;
  }
  return n;
}

bool Membership::IsAlive(const Slot& slot, absl::Time now) const {
  return slot.registered && now - slot.last_heartbeat <= heartbeat_timeout_;
}

int Membership::Alive(v1::Role role, absl::Time now) const {
  const std::vector<Slot>* slots = Slots(role);
  int n = 0;
  if (slots != nullptr) {
    for (const Slot& slot : *slots) n += IsAlive(slot, now) ? 1 : 0;
  }
  return n;
}

std::string Membership::InstanceAt(v1::Role role, int rank) const {
  const std::vector<Slot>* slots = Slots(role);
  if (slots == nullptr || rank < 0 || rank >= static_cast<int>(slots->size())) return "";
  const Slot& slot = (*slots)[rank];
  return slot.registered ? slot.member.instance_id() : "";
}

std::vector<v1::Member> Membership::List(absl::Time now) const {
  std::vector<v1::Member> members;
  for (const std::vector<Slot>* slots : {&workers_, &servers_}) {
    for (const Slot& slot : *slots) {
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
