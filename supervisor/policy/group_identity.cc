#include "supervisor/policy/group_identity.h"

namespace trainsup::supervisor {

std::string ToString(GroupOwnership ownership) {
  switch (ownership) {
    case GroupOwnership::kGone:
      return "gone";
    case GroupOwnership::kOurs:
      return "ours";
    case GroupOwnership::kStranger:
      return "stranger";
  }
  return "ownership(" + std::to_string(static_cast<int>(ownership)) + ")";
}

GroupOwnership JudgeGroup(const GroupIdentity& identity, const std::vector<GroupMember>& members) {
  if (identity.pgid <= 1) return GroupOwnership::kStranger;
  if (members.empty()) return GroupOwnership::kGone;
  for (const GroupMember& m : members) {
    if (m.pid == identity.pgid) {
      return m.start_ticks == identity.leader_start_ticks ? GroupOwnership::kOurs
                                                          : GroupOwnership::kStranger;
    }
  }
  for (const GroupMember& m : members) {
    if (m.start_ticks < identity.leader_start_ticks || m.start_ticks > identity.known_alive_ticks) {
      return GroupOwnership::kStranger;
    }
  }
  return GroupOwnership::kOurs;
}

}  // namespace trainsup::supervisor
