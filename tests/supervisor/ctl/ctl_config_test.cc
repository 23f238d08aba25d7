// Where trainctl connects: the flags, else the environment, else its config
// file; a client certificate needs its key; TLS needs an address.
#include "supervisor/ctl/ctl_config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace trainsup::supervisor {
namespace {

std::function<std::string(const char*)> EnvOf(std::map<std::string, std::string> vars) {
  return [vars](const char* name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
}

TEST(CtlConfig, TheFileNamesEverySettingWithPathsRelativeToIt) {
  absl::StatusOr<CtlConnection> c = ParseCtlConfig(
      "address = \"trainer-7:50051\"\ntls_ca = \"ca.pem\"\ntls_cert = \"/etc/pki/me.pem\"\n"
      "tls_key = \"me.key\"\ntls_server_name = \"trainer-7\"\ntoken_file = \"viewer.token\"\n"
      "socket = \"/run/other.sock\"\n",
      "/home/alice/.config/trainsup");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address, "trainer-7:50051");
  EXPECT_EQ(c->tls_ca, "/home/alice/.config/trainsup/ca.pem");
  EXPECT_EQ(c->tls_cert, "/etc/pki/me.pem");
  EXPECT_EQ(c->tls_key, "/home/alice/.config/trainsup/me.key");
  EXPECT_EQ(c->tls_server_name, "trainer-7") << "a name, not a path";
  EXPECT_EQ(c->token_file, "/home/alice/.config/trainsup/viewer.token");
  EXPECT_EQ(c->socket, "/run/other.sock");
  EXPECT_EQ(ParseCtlConfig("adress = \"x\"\n", "/d").status().message(), "adress: unknown key");
  EXPECT_EQ(ParseCtlConfig("tls_ca = 3\n", "/d").status().message(), "tls_ca: must be a string");
  EXPECT_FALSE(ParseCtlConfig("address = \n", "/d").ok());
}

TEST(CtlConfig, FlagsThenEnvironmentThenFile) {
  CtlConnection flags, file;
  flags.tls_cert = "/flag.pem";
  file.tls_cert = "/file.pem";
  file.tls_key = "/file.key";
  file.address = "file:1";
  const CtlConnection env = CtlConnectionFromEnv(EnvOf({{"TRAINCTL_ADDRESS", "env:2"},
                                                        {"TRAINCTL_TLS_KEY", "/env.key"},
                                                        {"TRAINSUP_SOCKET", "/env.sock"}}));
  const CtlConnection c = MergeCtlConnection(flags, env, file);
  EXPECT_EQ(c.tls_cert, "/flag.pem");
  EXPECT_EQ(c.tls_key, "/env.key");
  EXPECT_EQ(c.address, "env:2");
  EXPECT_EQ(c.socket, "/env.sock");
}

TEST(CtlConfig, ThePathOfTheFile) {
  bool named = true;
  EXPECT_EQ(CtlConfigPath(EnvOf({{"HOME", "/home/a"}}), &named),
            "/home/a/.config/trainsup/trainctl.toml");
  EXPECT_FALSE(named);
  EXPECT_EQ(CtlConfigPath(EnvOf({{"HOME", "/home/a"}, {"XDG_CONFIG_HOME", "/x"}}), &named),
            "/x/trainsup/trainctl.toml");
  EXPECT_EQ(CtlConfigPath(EnvOf({{"HOME", "/home/a"}, {"TRAINCTL_CONFIG", "/c.toml"}}), &named),
            "/c.toml");
  EXPECT_TRUE(named);
  EXPECT_EQ(CtlConfigPath(EnvOf({}), &named), "");
}

TEST(CtlConfig, ACertificateNeedsItsKeyAndTlsNeedsAnAddress) {
  CtlConnection c;
  EXPECT_TRUE(CheckCtlConnection(c).ok());
  c.address = "h:1";
  c.tls_cert = "/me.pem";
  EXPECT_EQ(CheckCtlConnection(c).message(),
            "a client certificate needs its key: give both --tls-cert and --tls-key (or neither)");
  c.tls_key = "/me.key";
  EXPECT_TRUE(CheckCtlConnection(c).ok());
  c.address.clear();
  EXPECT_FALSE(CheckCtlConnection(c).ok());
}

}  // namespace
}  // namespace trainsup::supervisor
