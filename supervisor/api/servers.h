// The daemon's listening sockets: the unix socket (mode 0660, optional
// group) serving the public API and the worker channel, and, when
// configured, a TCP port with TLS serving the public API only (the worker
// channel too with daemon.worker_channel_on_tcp). Each has the standard
// health service and server reflection.
#ifndef TRAINSUP_SUPERVISOR_API_SERVERS_H_
#define TRAINSUP_SUPERVISOR_API_SERVERS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "contracts/daemon_config.h"

namespace trainsup::supervisor {

// The PEM file `path` of config key `key` (daemon.tls_cert, ...), or
// FailedPrecondition naming the key, the file and the error: unreadable
// (its errno), over 1 MiB, or without a PEM block.
absl::StatusOr<std::string> ReadTlsFile(const std::string& key, const std::string& path);

class Servers {
 public:
  // The socket path the config names (StateLayout's default when empty).
  static std::string SocketPath(const DaemonConfig& config);

  // Prepares the socket's directory (FailedPrecondition when another daemon
  // answers on it), then starts the servers. The services must outlive this
  // object; a service registers with one server, so each port has its own
  // instances (`tcp_worker` is used only with worker_channel_on_tcp). `warn`
  // gets non-fatal problems (a socket group that does not exist).
  struct Services {
    grpc::Service* unix_api = nullptr;
    grpc::Service* unix_worker = nullptr;
    grpc::Service* tcp_api = nullptr;
    grpc::Service* tcp_worker = nullptr;
  };
  absl::Status Start(const DaemonConfig& config, const Services& services,
                     const std::function<void(const std::string&)>& warn);
  const std::string& socket_path() const { return socket_path_; }
  void SetServing(bool serving);
  // Stops accepting calls, cancels the rest after `grace`.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  absl::Status PrepareSocket();
  std::string socket_path_;
  std::unique_ptr<grpc::Server> unix_, tcp_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_API_SERVERS_H_
