// Whether a process group id still names a worker's group, or was reused
// by a stranger after the worker's group went away. Linux does not reuse a
// pid while a process group of that id has members, so a group whose every
// member existed while ours was known alive is ours; a leader with another
// start time, or a member that started after ours was last known alive,
// means the id now belongs to someone else. Pure: the caller reads /proc.
#ifndef TRAINSUP_SUPERVISOR_POLICY_GROUP_IDENTITY_H_
#define TRAINSUP_SUPERVISOR_POLICY_GROUP_IDENTITY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainsup::supervisor {

// A worker's process group as the daemon knows it. Times are clock ticks
// since boot (field 22 of /proc/PID/stat).
struct GroupIdentity {
  int pgid = 0;                     // the worker's pid: it leads its group
  uint64_t leader_start_ticks = 0;  // the worker's start time
  // The latest time the group was known to be the worker's: now while the
  // worker lives, its death as observed, or its last heartbeat when it died
  // while no daemon watched. 0: never known (nothing is ours then).
  uint64_t known_alive_ticks = 0;
};

struct GroupMember {
  int pid = 0;
  uint64_t start_ticks = 0;
};

enum class GroupOwnership {
  kGone,      // no live member: nothing to signal
  kOurs,      // the worker's group: signal it
  kStranger,  // the id was reused: never signal it
};

std::string ToString(GroupOwnership ownership);

// `members`: the live (non-zombie) processes whose group is identity.pgid,
// the leader among them when it lives.
GroupOwnership JudgeGroup(const GroupIdentity& identity, const std::vector<GroupMember>& members);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_GROUP_IDENTITY_H_
