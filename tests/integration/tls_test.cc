// TLS on the daemon's TCP port, as docs/configuration.md sets it up, with
// the real trainsupd and trainctl (issue 42, 9 and 10): a daemon that
// requires client certificates (daemon.tls_client_ca) refuses trainctl
// without one and serves it with one, given by flags, by the environment or
// by trainctl's config file; a TLS file the daemon cannot read stops it at
// start with the key, the file and the error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

using ::testing::HasSubstr;

// openssl, failing the test on error.
void Openssl(DaemonHarness& h, std::vector<std::string> args, const std::string& what) {
  args.insert(args.begin(), "/usr/bin/openssl");
  CommandResult r = RunCommand(args, Seconds(60), h.dir() + "/openssl-" + what);
  ASSERT_EQ(r.code, 0) << what << ": " << r.err;
}

// A CA, a server certificate for "localhost" and a client certificate, both
// signed by the CA, in h.dir().
void MakeCertificates(DaemonHarness& h) {
  const std::string d = h.dir();
  Openssl(h,
          {"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "/ca.key", "-out",
           d + "/ca.pem", "-days", "1", "-subj", "/CN=trainsup test CA"},
          "ca");
  for (const std::string who : {"server", "client"}) {
    Openssl(h,
            {"req", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "/" + who + ".key", "-out",
             d + "/" + who + ".csr", "-subj", "/CN=" + (who == "server" ? "localhost" : who)},
            who + "-csr");
    WriteFileText(d + "/" + who + ".ext", who == "server" ? "subjectAltName=DNS:localhost\n"
                                                          : "extendedKeyUsage=clientAuth\n");
    Openssl(h,
            {"x509", "-req", "-in", d + "/" + who + ".csr", "-CA", d + "/ca.pem", "-CAkey",
             d + "/ca.key", "-CAcreateserial", "-out", d + "/" + who + ".pem", "-days", "1",
             "-extfile", d + "/" + who + ".ext"},
            who + "-sign");
  }
}

TEST(Tls, ADaemonThatRequiresClientCertificatesServesTrainctlOnlyWithOne) {
  DaemonHarness h;
  ASSERT_NO_FATAL_FAILURE(MakeCertificates(h));
  const std::string d = h.dir();
  const std::string address = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  h.Set("daemon.tcp_address", "\"" + address + "\"");
  h.Set("daemon.tls_cert", "\"" + d + "/server.pem\"");
  h.Set("daemon.tls_key", "\"" + d + "/server.key\"");
  h.Set("daemon.tls_client_ca", "\"" + d + "/ca.pem\"");
  ASSERT_TRUE(h.Start());
  const std::vector<std::string> base = {
      TRAINCTL_BIN,          "--address",         address,     "--tls-ca",
      d + "/ca.pem",         "--tls-server-name", "localhost", "--token-file",
      h.viewer_token_path(), "--timeout",         "10"};
  auto node = [&](std::vector<std::string> argv, const std::string& what) {
    return RunCommand(argv, Seconds(60), d + "/ctl-" + what);
  };
  std::vector<std::string> without = base;
  without.push_back("node");
  CommandResult refused = node(without, "without");
  EXPECT_NE(refused.code, 0) << "served a client without a certificate: " << refused.out;

  std::vector<std::string> with = base;
  for (const std::string& a : {std::string("--tls-cert"), d + "/client.pem",
                               std::string("--tls-key"), d + "/client.key", std::string("node")}) {
    with.push_back(a);
  }
  CommandResult served = node(with, "with");
  EXPECT_EQ(served.code, 0) << served.err;
  EXPECT_THAT(served.out, HasSubstr("cpu:0")) << served.out;

  // The same from the environment.
  std::vector<std::string> by_env = {"/usr/bin/env", "TRAINCTL_TLS_CERT=" + d + "/client.pem",
                                     "TRAINCTL_TLS_KEY=" + d + "/client.key"};
  by_env.insert(by_env.end(), without.begin(), without.end());
  CommandResult env_served = node(by_env, "env");
  EXPECT_EQ(env_served.code, 0) << env_served.err;

  // And from trainctl's config file, its paths relative to the file.
  WriteFileText(d + "/trainctl.toml",
                "address = \"" + address +
                    "\"\ntls_ca = \"ca.pem\"\ntls_cert = \"client.pem\"\ntls_key = \"client.key\"\n"
                    "tls_server_name = \"localhost\"\ntoken_file = \"" +
                    h.viewer_token_path() + "\"\n");
  CommandResult file_served = node(
      {"/usr/bin/env", "TRAINCTL_CONFIG=" + d + "/trainctl.toml", TRAINCTL_BIN, "node"}, "file");
  EXPECT_EQ(file_served.code, 0) << file_served.err;

  // A certificate without its key is a usage error, named.
  std::vector<std::string> half = base;
  for (const std::string& a : {std::string("--tls-cert"), d + "/client.pem", std::string("node")}) {
    half.push_back(a);
  }
  CommandResult usage = node(half, "half");
  EXPECT_EQ(usage.code, 2) << "trainctl's usage exit (docs/trainctl.md)";
  EXPECT_THAT(usage.err, HasSubstr("a client certificate needs its key"));
}

TEST(Tls, AnUnreadableTlsFileStopsTheDaemonNamingIt) {
  DaemonHarness h;
  ASSERT_NO_FATAL_FAILURE(MakeCertificates(h));
  const std::string d = h.dir();
  h.Set("daemon.tcp_address", "\"127.0.0.1:" + std::to_string(FreeLoopbackPort()) + "\"");
  h.Set("daemon.tls_cert", "\"" + d + "/server.pem\"");
  // A directory: open succeeds, read fails with EISDIR, as root reads any
  // file whatever its mode.
  h.Set("daemon.tls_key", "\"" + d + "\"");
  EXPECT_FALSE(h.Start()) << "the daemon served with a key it could not read";
  EXPECT_THAT(h.DaemonLog(), HasSubstr("daemon.tls_key: cannot read " + d + ": Is a directory"));
}

}  // namespace
}  // namespace trainsup::integration
