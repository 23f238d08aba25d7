// Authenticating a call from its metadata.
#include "supervisor/policy/auth.h"

#include <gtest/gtest.h>

#include <set>

namespace trainsup::supervisor {
namespace {

const std::vector<Token> kTokens = {{"ops", TokenRole::kOperator, "op-secret"},
                                    {"grafana", TokenRole::kViewer, "view-secret"}};

TEST(Authenticate, RolesAndTokens) {
  AuthResult r =
      Authenticate(kTokens, std::string("Bearer op-secret"), TokenRole::kOperator, "SubmitRun");
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.token_name, "ops");
  r = Authenticate(kTokens, std::string("Bearer view-secret"), TokenRole::kViewer, "GetRun");
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.token_name, "grafana");
  r = Authenticate(kTokens, std::string("Bearer view-secret"), TokenRole::kOperator, "SubmitRun");
  EXPECT_EQ(r.status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status.message(), "token \"grafana\" has role viewer; SubmitRun needs operator");
}

TEST(Authenticate, MissingMalformedAndUnknownAreUnauthenticated) {
  EXPECT_EQ(Authenticate(kTokens, std::nullopt, TokenRole::kViewer, "GetRun").status.code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(
      Authenticate(kTokens, std::string("op-secret"), TokenRole::kViewer, "GetRun").status.code(),
      absl::StatusCode::kUnauthenticated);
  AuthResult r =
      Authenticate(kTokens, std::string("Bearer op-secre"), TokenRole::kViewer, "GetRun");
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status.message(), "unknown token");
  EXPECT_TRUE(r.token_name.empty());
}

TEST(Authenticate, NoTokensConfiguredAllowsEverything) {
  EXPECT_TRUE(Authenticate({}, std::nullopt, TokenRole::kOperator, "SubmitRun").status.ok());
}

TEST(SecureRandomHex, GivesTheLengthAskedAndNeverRepeats) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string s = SecureRandomHex(16);
    ASSERT_EQ(s.size(), 32u);
    EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos) << s;
    EXPECT_TRUE(seen.insert(s).second) << "a 128-bit value repeated: " << s;
  }
}

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
}

}  // namespace
}  // namespace trainsup::supervisor
