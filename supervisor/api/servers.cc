#include "supervisor/api/servers.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "contracts/run_layout.h"

namespace trainsup::supervisor {

absl::StatusOr<std::string> ReadTlsFile(const std::string& key, const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": cannot read ", path, ": ", strerror(errno)));
  }
  std::string out;
  char buf[8192];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat(key, ": cannot read ", path, ": ", strerror(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1 << 20)) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat(key, ": ", path, " is over 1 MiB: not a PEM file"));
    }
  }
  close(fd);
  if (out.find("-----BEGIN ") == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(key, ": ", path, " holds no PEM block"));
  }
  return out;
}

namespace fs = std::filesystem;

std::string Servers::SocketPath(const DaemonConfig& config) {
  return config.daemon.socket_path.empty()
             ? StateLayout(config.daemon.state_dir).DefaultSocketPath()
             : config.daemon.socket_path;
}

absl::Status Servers::PrepareSocket() {
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("daemon.socket_path: longer than ",
                                                   sizeof(sockaddr_un::sun_path) - 1,
                                                   " bytes: ", socket_path_));
  }
  std::error_code ec;
  const fs::path dir = fs::path(socket_path_).parent_path();
  if (!fs::exists(dir)) {
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
    }
    chmod(dir.c_str(), 0750);
  }
  if (fs::exists(socket_path_)) {
    // A socket someone answers on belongs to a live daemon: never steal it.
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
    const bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (live) {
      return absl::FailedPreconditionError(
          absl::StrCat("another trainsupd is serving ", socket_path_));
    }
    fs::remove(socket_path_, ec);
  }
  return absl::OkStatus();
}

absl::Status Servers::Start(const DaemonConfig& config, const Services& services,
                            const std::function<void(const std::string&)>& warn) {
  socket_path_ = SocketPath(config);
  if (absl::Status s = PrepareSocket(); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  {
    grpc::ServerBuilder builder;
    // The socket is created 0660 (umask while binding): never briefly wider.
    const mode_t old_umask = umask(0117);
    builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
    builder.RegisterService(services.unix_api);
    builder.RegisterService(services.unix_worker);
    unix_ = builder.BuildAndStart();
    umask(old_umask);
    if (!unix_) return absl::UnavailableError(absl::StrCat("cannot listen on unix:", socket_path_));
  }
  chmod(socket_path_.c_str(), 0660);
  if (!config.daemon.socket_group.empty()) {
    if (group* g = getgrnam(config.daemon.socket_group.c_str())) {
      if (chown(socket_path_.c_str(), -1, g->gr_gid) != 0) {
        warn(absl::StrCat("cannot chgrp ", socket_path_, " to ", config.daemon.socket_group, ": ",
                          strerror(errno)));
      }
    } else {
      warn(absl::StrCat("daemon.socket_group ", config.daemon.socket_group, " does not exist"));
    }
  }
  if (!config.daemon.tcp_address.empty()) {
    grpc::SslServerCredentialsOptions ssl(
        config.daemon.tls_client_ca.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    absl::StatusOr<std::string> key = ReadTlsFile("daemon.tls_key", config.daemon.tls_key);
    if (!key.ok()) return key.status();
    absl::StatusOr<std::string> cert = ReadTlsFile("daemon.tls_cert", config.daemon.tls_cert);
    if (!cert.ok()) return cert.status();
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!config.daemon.tls_client_ca.empty()) {
      absl::StatusOr<std::string> ca =
          ReadTlsFile("daemon.tls_client_ca", config.daemon.tls_client_ca);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort(config.daemon.tcp_address, grpc::SslServerCredentials(ssl));
    builder.RegisterService(services.tcp_api);
    // The worker channel stays on the unix socket unless asked for: a
    // worker stream on the public port is a door for guessing tokens.
    if (config.daemon.worker_channel_on_tcp) builder.RegisterService(services.tcp_worker);
    tcp_ = builder.BuildAndStart();
    if (!tcp_) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", config.daemon.tcp_address));
    }
  }
  SetServing(true);
  return absl::OkStatus();
}

void Servers::SetServing(bool serving) {
  if (unix_) unix_->GetHealthCheckService()->SetServingStatus(serving);
  if (tcp_) tcp_->GetHealthCheckService()->SetServingStatus(serving);
}

void Servers::Shutdown(std::chrono::milliseconds grace) {
  const auto deadline = std::chrono::system_clock::now() + grace;
  if (tcp_) tcp_->Shutdown(deadline);
  if (unix_) unix_->Shutdown(deadline);
}

}  // namespace trainsup::supervisor
