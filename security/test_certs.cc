#include "security/test_certs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/subprocess.h"

namespace onebit::security {
namespace {

// Runs openssl with `args`; its output goes to dir/openssl.log, quoted in errors.
absl::Status RunOpenssl(const std::string& openssl, const std::string& dir,
                        const std::vector<std::string>& args) {
  ProcessOptions p;
  p.argv = {openssl};
  p.argv.insert(p.argv.end(), args.begin(), args.end());
  p.name = "openssl";
  p.log_path = dir + "/openssl.log";
  std::filesystem::remove(p.log_path);
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Process> process, Process::Start(p));
  ONEBIT_ASSIGN_OR_RETURN(int code, process->Wait(absl::Seconds(60)));
  if (code != 0) {
    std::ifstream log(p.log_path);
    const std::string output(std::istreambuf_iterator<char>(log), {});
    return absl::InternalError(absl::StrCat("openssl ", args.front(), " exited with ", code, ": ",
                                            output));
  }
  return absl::OkStatus();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> FindOpenssl() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/openssl");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  for (const char* fallback : {"/usr/bin/openssl", "/usr/local/bin/openssl"}) {
    if (access(fallback, X_OK) == 0) return std::string(fallback);
  }
  return absl::FailedPreconditionError(
      "the openssl command is not installed (not on $PATH, nor /usr/bin): the TLS tests make "
      "their certificates with it; install it (apt-get install openssl, as "
      "deploy/install-deps.sh does)");
}

absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir) {
  ONEBIT_ASSIGN_OR_RETURN(std::string openssl, FindOpenssl());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  TestCerts c;
  c.dir = dir;
  auto file = [&dir](const char* name) { return absl::StrCat(dir, "/", name); };
  c.ca = file("ca.pem");
  c.ca_key = file("ca.key");
  c.node = file("node.pem");
  c.node_key = file("node.key");
  c.client = file("client.pem");
  c.client_key = file("client.key");
  c.rogue = file("rogue.pem");
  c.rogue_key = file("rogue.key");
  // EC P-256 keys: quick to make, and supported by every TLS stack here.
  const std::vector<std::string> new_key = {"-newkey", "ec", "-pkeyopt",
                                            "ec_paramgen_curve:prime256v1", "-nodes"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::string kSan = "subjectAltName=IP:127.0.0.1,DNS:localhost";
  ONEBIT_RETURN_IF_ERROR(RunOpenssl(
      openssl, dir,
      with(with({"req", "-x509"}, new_key),
           {"-keyout", c.ca_key, "-out", c.ca, "-days", "2", "-subj", "/CN=onebit test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
            "keyUsage=critical,keyCertSign,cRLSign"})));
  // Leaf certificates: a request, then the CA signs it with the extensions of an ext file.
  auto leaf = [&](const std::string& cert, const std::string& key, const std::string& subject,
                  const std::string& extensions) -> absl::Status {
    const std::string csr = cert + ".csr", ext = cert + ".ext";
    ONEBIT_RETURN_IF_ERROR(WriteText(ext, extensions));
    ONEBIT_RETURN_IF_ERROR(RunOpenssl(
        openssl, dir, with(with({"req"}, new_key), {"-keyout", key, "-out", csr, "-subj", subject})));
    return RunOpenssl(openssl, dir,
                      {"x509", "-req", "-in", csr, "-CA", c.ca, "-CAkey", c.ca_key,
                       "-CAcreateserial", "-CAserial", file("ca.srl"), "-out", cert, "-days",
                       "2", "-extfile", ext});
  };
  ONEBIT_RETURN_IF_ERROR(leaf(c.node, c.node_key, "/CN=onebit node",
                              absl::StrCat("basicConstraints=CA:FALSE\n"
                                           "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                           "extendedKeyUsage=serverAuth,clientAuth\n",
                                           kSan, "\n")));
  ONEBIT_RETURN_IF_ERROR(leaf(c.client, c.client_key, "/CN=onebit worker",
                              "basicConstraints=CA:FALSE\n"
                              "keyUsage=critical,digitalSignature,keyEncipherment\n"
                              "extendedKeyUsage=clientAuth\n"));
  // The rogue: what an attacker can make without the CA's key.
  ONEBIT_RETURN_IF_ERROR(RunOpenssl(
      openssl, dir,
      with(with({"req", "-x509"}, new_key),
           {"-keyout", c.rogue_key, "-out", c.rogue, "-days", "2", "-subj", "/CN=onebit node",
            "-addext", kSan, "-addext", "extendedKeyUsage=serverAuth,clientAuth"})));
  for (const std::string& key : {c.ca_key, c.node_key, c.client_key, c.rogue_key}) {
    chmod(key.c_str(), 0600);
  }
  return c;
}

absl::Status WriteTokenFile(const std::string& path, const std::string& token) {
  ONEBIT_RETURN_IF_ERROR(WriteText(path, token + "\n"));
  chmod(path.c_str(), 0600);
  return absl::OkStatus();
}

}  // namespace onebit::security
