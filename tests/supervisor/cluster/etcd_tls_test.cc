// The etcd client over TLS against a real etcd started with
// --client-cert-auth, its certificates made here with openssl
// (tests/common/etcd_server.h): the node's certificate is let in, a client
// without one, with one from another CA, or speaking plain text is not,
// and a client that does not trust etcd's CA refuses etcd.
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "supervisor/cluster/etcd_client.h"
#include "tests/common/etcd_server.h"
#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

using ::trainsup::testing::EtcdServer;
using ::trainsup::testing::TempDir;
using ::trainsup::testing::TestPki;

constexpr double kDeadlineS = 2.0;

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status made = ::trainsup::testing::MakeTestPki(dir_.path(), &pki_);
    ASSERT_TRUE(made.ok()) << made;
    etcd_.UseTls(pki_);
    absl::Status started = etcd_.Start();
    ASSERT_TRUE(started.ok()) << started;
  }

  // A client with these files (paths; "" for none), or the failure.
  std::unique_ptr<EtcdClient> Client(const std::string& ca, const std::string& cert,
                                     const std::string& key) {
    absl::StatusOr<EtcdTls> tls = ReadEtcdTls(ca, cert, key);
    EXPECT_TRUE(tls.ok()) << tls.status();
    if (!tls.ok()) return nullptr;
    auto client = MakeEtcdClient(etcd_.endpoint(), kDeadlineS, *tls);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  TempDir dir_{"etcd_tls"};
  TestPki pki_;
  EtcdServer etcd_;
};

TEST_F(EtcdTlsTest, TheNodesCertificateIsLetIn) {
  std::unique_ptr<EtcdClient> client = Client(pki_.ca, pki_.client_cert, pki_.client_key);
  ASSERT_NE(client, nullptr);
  auto put = client->Put("/t/a", "1");
  ASSERT_TRUE(put.ok()) << put.status();
  auto got = client->Get("/t/a");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "1");
  auto lease = client->GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(client->KeepAlive(*lease).ok());
  EXPECT_TRUE(client->Revoke(*lease).ok());
}

TEST_F(EtcdTlsTest, ClientsWithoutAGoodCertificateAreRefused) {
  struct Case {
    const char* what;
    std::string ca, cert, key;
  };
  for (const Case& c :
       {Case{"no client certificate", pki_.ca, "", ""},
        Case{"a certificate from another CA", pki_.ca, pki_.rogue_cert, pki_.rogue_key},
        Case{"etcd's CA not trusted", pki_.rogue_ca, pki_.client_cert, pki_.client_key}}) {
    SCOPED_TRACE(c.what);
    std::unique_ptr<EtcdClient> client = Client(c.ca, c.cert, c.key);
    ASSERT_NE(client, nullptr);
    auto put = client->Put("/t/" + std::string(c.what), "x");
    EXPECT_FALSE(put.ok());
    EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable) << put.status();
  }
  // Plain text to a TLS port.
  auto plain = MakeEtcdClient(etcd_.endpoint(), kDeadlineS);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE((*plain)->Put("/t/plain", "x").ok());
  // Nothing of theirs was written.
  std::unique_ptr<EtcdClient> good = Client(pki_.ca, pki_.client_cert, pki_.client_key);
  ASSERT_NE(good, nullptr);
  auto range = good->GetPrefix("/t/");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_TRUE(range->kvs.empty()) << range->kvs.size() << " keys, the first " << range->kvs[0].key;
}

TEST_F(EtcdTlsTest, HttpsSchemeIsAcceptedOnlyOverTls) {
  absl::StatusOr<EtcdTls> tls = ReadEtcdTls(pki_.ca, pki_.client_cert, pki_.client_key);
  ASSERT_TRUE(tls.ok()) << tls.status();
  auto client = MakeEtcdClient("https://" + etcd_.endpoint(), kDeadlineS, *tls);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Put("/t/https", "1").ok());
  auto refused = MakeEtcdClient("http://" + etcd_.endpoint(), kDeadlineS, *tls);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "over TLS")) << refused.status();
  auto plain = MakeEtcdClient("https://" + etcd_.endpoint(), kDeadlineS);
  ASSERT_FALSE(plain.ok());
  EXPECT_TRUE(absl::StrContains(plain.status().message(), "without TLS")) << plain.status();
}

TEST(ReadEtcdTls, NamesTheFileThatIsWrong) {
  TempDir dir("etcd_tls_files");
  const std::string not_pem = dir.path() + "/not.pem";
  std::ofstream(not_pem) << "hello\n";
  const std::string missing = dir.path() + "/missing.pem";
  struct Case {
    std::string ca, cert, key, message;
  };
  for (const Case& c :
       {Case{missing, "", "", "cluster.etcd_ca: cannot read " + missing},
        Case{not_pem, "", "", "cluster.etcd_ca: " + not_pem + " is not a PEM file"},
        Case{"", not_pem, not_pem, "cluster.etcd_ca: required with a client certificate"},
        Case{not_pem, not_pem, "", "a client certificate needs both"}}) {
    absl::StatusOr<EtcdTls> tls = ReadEtcdTls(c.ca, c.cert, c.key);
    ASSERT_FALSE(tls.ok()) << c.message;
    EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(tls.status().message(), c.message)) << tls.status();
  }
  absl::StatusOr<EtcdTls> none = ReadEtcdTls("", "", "");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->enabled());
}

}  // namespace
}  // namespace trainsup::supervisor
