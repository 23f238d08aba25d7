// Where trainctl connects and how it proves who it is: the unix socket or
// the TCP address, the TLS files (the CA, the client's certificate and key
// for a daemon with daemon.tls_client_ca) and the token file. Each setting
// comes from the command line, else the environment, else trainctl's config
// file (docs/trainctl.md, "Connecting"). Pure but for reading that file.
#ifndef TRAINSUP_SUPERVISOR_CTL_CTL_CONFIG_H_
#define TRAINSUP_SUPERVISOR_CTL_CTL_CONFIG_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainsup::supervisor {

struct CtlConnection {
  std::string socket;           // --socket, $TRAINSUP_SOCKET, socket
  std::string address;          // --address, $TRAINCTL_ADDRESS, address
  std::string tls_ca;           // --tls-ca, $TRAINCTL_TLS_CA, tls_ca
  std::string tls_cert;         // --tls-cert, $TRAINCTL_TLS_CERT, tls_cert
  std::string tls_key;          // --tls-key, $TRAINCTL_TLS_KEY, tls_key
  std::string tls_server_name;  // --tls-server-name, $TRAINCTL_TLS_SERVER_NAME, tls_server_name
  std::string token_file;       // --token-file, $TRAINCTL_TOKEN_FILE, token_file
};

// The settings the environment gives (`env` reads one variable, "" when unset).
CtlConnection CtlConnectionFromEnv(const std::function<std::string(const char*)>& env);

// The config file to read: $TRAINCTL_CONFIG, else
// $XDG_CONFIG_HOME/trainsup/trainctl.toml, else
// $HOME/.config/trainsup/trainctl.toml; "" when none of them is set.
// `explicit_file` says whether $TRAINCTL_CONFIG named it (then it must exist).
std::string CtlConfigPath(const std::function<std::string(const char*)>& env, bool* explicit_file);

// The file's settings: string keys socket, address, tls_ca, tls_cert,
// tls_key, tls_server_name, token_file at its top level; relative paths are
// resolved against `base_dir` (the file's folder). InvalidArgument naming
// the key (an unknown key, a non-string) or the TOML error.
absl::StatusOr<CtlConnection> ParseCtlConfig(const std::string& text, const std::string& base_dir);

// `flags`, each empty setting taken from `env`, then from `file`.
CtlConnection MergeCtlConnection(const CtlConnection& flags, const CtlConnection& env,
                                 const CtlConnection& file);

// InvalidArgument when the settings cannot work together: a client
// certificate without its key (or the key without it), or TLS settings
// without an address (the unix socket has no TLS).
absl::Status CheckCtlConnection(const CtlConnection& c);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CTL_CTL_CONFIG_H_
