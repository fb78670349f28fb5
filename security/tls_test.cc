// Loading TLS material: good files load, and every mistake is an error naming the file.
#include "security/tls.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "security/test_certs.h"

namespace onebit::security {
namespace {

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    absl::StatusOr<TestCerts> made =
        MakeTestCerts(std::string(tmp != nullptr ? tmp : "/tmp") + "/certs");
    if (!made.ok()) {
      error_ = new std::string(made.status().ToString());
      return;
    }
    certs_ = new TestCerts(*made);
  }
  // Fails (never skips) without openssl: the message says what to install.
  void SetUp() override {
    ASSERT_NE(certs_, nullptr) << "cannot make the test certificates: " << *error_;
  }
  static TestCerts* certs_;
  static std::string* error_;
};
TestCerts* TlsTest::certs_ = nullptr;
std::string* TlsTest::error_ = nullptr;

TEST_F(TlsTest, LoadsEveryIdentity) {
  for (const TlsOptions& o : {certs_->Node(), certs_->Client(), certs_->Rogue()}) {
    absl::StatusOr<TlsMaterial> m = LoadTlsMaterial(o);
    ASSERT_TRUE(m.ok()) << o.cert << ": " << m.status();
    EXPECT_NE(m->cert_pem.find("BEGIN CERTIFICATE"), std::string::npos);
    EXPECT_FALSE(m->ca_pem.empty());
  }
  EXPECT_TRUE(GrpcServerCredentials(certs_->Node()).ok());
  EXPECT_TRUE(GrpcChannelCredentials(certs_->Client()).ok());
  EXPECT_TRUE(GrpcChannelCredentials(certs_->NoCert()).ok());
}

TEST_F(TlsTest, DisabledIsInsecure) {
  EXPECT_FALSE(TlsOptions().enabled());
  EXPECT_TRUE(GrpcServerCredentials(TlsOptions()).ok());
  EXPECT_TRUE(GrpcChannelCredentials(TlsOptions()).ok());
  EXPECT_EQ(HandshakeHint(TlsOptions()), "");
  EXPECT_NE(HandshakeHint(certs_->Client()).find("TLS handshake"), std::string::npos);
}

TEST_F(TlsTest, ErrorsNameTheFile) {
  // A key that belongs to another certificate.
  const TlsOptions mismatched = certs_->With(certs_->node, certs_->client_key);
  const absl::Status mismatch = LoadTlsMaterial(mismatched).status();
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("does not belong"), absl::string_view::npos) << mismatch;
  EXPECT_NE(mismatch.message().find(certs_->client_key), absl::string_view::npos) << mismatch;
  // A missing file.
  const absl::Status missing = LoadTlsMaterial(certs_->With(certs_->dir + "/nope.pem", certs_->node_key)).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("nope.pem"), absl::string_view::npos) << missing;
  // A key where the certificate should be.
  const absl::Status not_cert = LoadTlsMaterial(certs_->With(certs_->node_key, certs_->node_key)).status();
  EXPECT_EQ(not_cert.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_cert.message().find("no PEM certificate"), absl::string_view::npos) << not_cert;
  // A certificate without its key.
  EXPECT_EQ(LoadTlsMaterial(certs_->With(certs_->node, "")).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A server needs an identity, and a CA for mutual TLS.
  EXPECT_EQ(GrpcServerCredentials(certs_->NoCert()).status().code(),
            absl::StatusCode::kInvalidArgument);
  TlsOptions no_ca = certs_->Node();
  no_ca.ca_cert.clear();
  const absl::Status mutual = GrpcServerCredentials(no_ca).status();
  EXPECT_EQ(mutual.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mutual.message().find("mutual TLS needs the CA"), absl::string_view::npos) << mutual;
  no_ca.mutual = false;
  EXPECT_TRUE(GrpcServerCredentials(no_ca).ok());
}

}  // namespace
}  // namespace onebit::security
