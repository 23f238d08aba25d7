#include "supervisor/ctl/ctl_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "contracts/toml_reader.h"

namespace trainsup::supervisor {
namespace {

// The settings by their config-file key.
std::pair<const char*, std::string CtlConnection::*> const kKeys[] = {
    {"socket", &CtlConnection::socket},
    {"address", &CtlConnection::address},
    {"tls_ca", &CtlConnection::tls_ca},
    {"tls_cert", &CtlConnection::tls_cert},
    {"tls_key", &CtlConnection::tls_key},
    {"tls_server_name", &CtlConnection::tls_server_name},
    {"token_file", &CtlConnection::token_file},
};

bool IsPathKey(const std::string& key) {
  return key == "socket" || key == "tls_ca" || key == "tls_cert" || key == "tls_key" ||
         key == "token_file";
}

}  // namespace

CtlConnection CtlConnectionFromEnv(const std::function<std::string(const char*)>& env) {
  CtlConnection c;
  c.socket = env("TRAINSUP_SOCKET");
  c.address = env("TRAINCTL_ADDRESS");
  c.tls_ca = env("TRAINCTL_TLS_CA");
  c.tls_cert = env("TRAINCTL_TLS_CERT");
  c.tls_key = env("TRAINCTL_TLS_KEY");
  c.tls_server_name = env("TRAINCTL_TLS_SERVER_NAME");
  c.token_file = env("TRAINCTL_TOKEN_FILE");
  return c;
}

std::string CtlConfigPath(const std::function<std::string(const char*)>& env, bool* explicit_file) {
  *explicit_file = false;
  if (std::string path = env("TRAINCTL_CONFIG"); !path.empty()) {
    *explicit_file = true;
    return path;
  }
  if (std::string xdg = env("XDG_CONFIG_HOME"); !xdg.empty()) {
    return absl::StrCat(xdg, "/trainsup/trainctl.toml");
  }
  if (std::string home = env("HOME"); !home.empty()) {
    return absl::StrCat(home, "/.config/trainsup/trainctl.toml");
  }
  return "";
}

absl::StatusOr<CtlConnection> ParseCtlConfig(const std::string& text, const std::string& base_dir) {
  absl::StatusOr<toml::table> table = ParseTomlText(text);
  if (!table.ok()) return table.status();
  TomlFieldReader r(&*table, "");
  CtlConnection c;
  for (const auto& [key, field] : kKeys) {
    std::string value;
    if (absl::Status s = r.String(key, &value); !s.ok()) return s;
    if (IsPathKey(key) && !value.empty() && value[0] != '/' && !base_dir.empty()) {
      value = absl::StrCat(base_dir, "/", value);
    }
    c.*field = std::move(value);
  }
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return c;
}

CtlConnection MergeCtlConnection(const CtlConnection& flags, const CtlConnection& env,
                                 const CtlConnection& file) {
  CtlConnection out;
  for (const auto& [key, field] : kKeys) {
    out.*field = !(flags.*field).empty() ? flags.*field
                 : !(env.*field).empty() ? env.*field
                                         : file.*field;
  }
  return out;
}

absl::Status CheckCtlConnection(const CtlConnection& c) {
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its key: give both --tls-cert and --tls-key (or neither)");
  }
  if (c.address.empty() &&
      (!c.tls_ca.empty() || !c.tls_cert.empty() || !c.tls_server_name.empty())) {
    return absl::InvalidArgumentError(
        "TLS settings (--tls-ca, --tls-cert, --tls-key, --tls-server-name) need --address: the "
        "unix socket has no TLS");
  }
  return absl::OkStatus();
}

}  // namespace trainsup::supervisor
