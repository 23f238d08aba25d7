// contracts/version.h: the one version, and which workers a daemon serves.
#include "contracts/version.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace trainsup {
namespace {

std::string Message(absl::string_view daemon, absl::string_view peer) {
  return std::string(CheckPeerVersion(daemon, peer).message());
}

TEST(Version, IsTheRepositorysVersionFile) {
  std::ifstream in(TRAINSUP_SOURCE_DIR "/VERSION");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(Version(), text);
  EXPECT_TRUE(CheckPeerVersion(Version(), Version()).ok());
}

TEST(Version, ZeroMajorServesItsOwnMinorOnly) {
  EXPECT_TRUE(CheckPeerVersion("0.1.0", "0.1.0").ok());
  EXPECT_TRUE(CheckPeerVersion("0.1.0", "0.1.7").ok());
  EXPECT_TRUE(CheckPeerVersion("0.1.3", "0.1.0").ok());
  EXPECT_TRUE(CheckPeerVersion("0.1.0", "0.1.2-rc1").ok());
  EXPECT_TRUE(CheckPeerVersion("0.1.0", "0.1.2+local.5").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckPeerVersion("0.1.0", "0.2.0")));
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckPeerVersion("0.2.0", "0.1.9")));
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckPeerVersion("0.1.0", "1.1.0")));
}

TEST(Version, FromOneOnTheMajorDecides) {
  EXPECT_TRUE(CheckPeerVersion("1.0.0", "1.9.3").ok());
  EXPECT_TRUE(CheckPeerVersion("1.9.3", "1.0.0").ok());
  EXPECT_TRUE(CheckPeerVersion("12.3.4", "12.0.0").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckPeerVersion("1.0.0", "2.0.0")));
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckPeerVersion("2.0.0", "1.9.9")));
}

TEST(Version, TheRefusalNamesBothVersionsAndTheWayOut) {
  EXPECT_EQ(Message("0.1.0", "0.2.3"),
            "worker version 0.2.3 cannot be served by trainsupd 0.1.0, which serves 0.1.x; use a "
            "trainsup-worker or Python client of version 0.1.x (deploy/build-worker.sh builds the "
            "worker from the daemon's sources, pip install the client from them)");
  EXPECT_EQ(Message("2.4.1", "1.0.0")
                .rfind("worker version 1.0.0 cannot be served by trainsupd 2.4.1, which serves", 0),
            0u);
  EXPECT_NE(Message("2.4.1", "1.0.0").find("serves 2.x.y;"), std::string::npos);
}

TEST(Version, MissingAndMalformedPeerVersionsAreRefusedByName) {
  EXPECT_NE(Message("0.1.0", "").find("the worker sent no version (older than trainsup 0.1.0)"),
            std::string::npos);
  for (const char* bad : {"1", "0.1", "0.1.0.0", "v0.1.0", "0.1.x", "0..1", " 0.1.0", "0.1.0 ",
                          "0.1.-1", "00000000001.1.0", "0.1.0-", "-0.1.0"}) {
    SCOPED_TRACE(bad);
    const absl::Status s = CheckPeerVersion("0.1.0", bad);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  }
  EXPECT_NE(Message("0.1.0", "v0.1.0").find("\"v0.1.0\" is not MAJOR.MINOR.PATCH"),
            std::string::npos);
}

TEST(Version, AMalformedDaemonVersionServesNobody) {
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckPeerVersion("unknown", "0.1.0")));
}

}  // namespace
}  // namespace trainsup
