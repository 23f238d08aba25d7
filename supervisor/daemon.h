// trainsupd: the supervisor daemon. One Boost.Asio event loop owns all run,
// attempt, worker and slot state; gRPC's callback threads only parse,
// authenticate and validate requests, then post them to the loop. Child
// exits arrive on the loop through pidfds (for workers we started and for
// workers adopted from a previous daemon alike), heartbeats through the
// worker channel, and everything the loop decides is written to the state
// store before it is acted on.
//
// docs/supervisor.md describes the behaviour; the worker contract is
// docs/design.md's.
#ifndef TRAINSUP_SUPERVISOR_DAEMON_H_
#define TRAINSUP_SUPERVISOR_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "contracts/daemon_config.h"

namespace spdlog {
class logger;
}

namespace trainsup::supervisor {

class Daemon {
 public:
  // Opens the state store, discovers slots, adopts or classifies the
  // workers of a previous daemon, and starts serving on the configured
  // socket (and TCP with TLS when configured). FailedPrecondition when
  // another daemon already serves the socket.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const DaemonConfig& config,
                                                        const std::string& config_path,
                                                        std::shared_ptr<spdlog::logger> log);
  virtual ~Daemon() = default;

  // Runs the event loop until SIGTERM or SIGINT (graceful shutdown: workers
  // are asked to checkpoint and stop, then killed after the deadline).
  // SIGHUP reloads the configuration where that is safe. Returns the exit
  // status for main().
  virtual int Run() = 0;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_DAEMON_H_
