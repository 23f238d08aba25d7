// A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests: one member
// on two free loopback ports with its data in a temporary directory, in
// plain text or (UseTls) over TLS with client certificates. Stop()
// and Start() again keep the ports and the data, as an operator's restart
// would; the destructor kills it and removes the directory. The process
// also dies with the thread that started it (PR_SET_PDEATHSIG), so a test
// that crashes leaves no etcd behind.
#ifndef TRAINSUP_TESTS_COMMON_ETCD_SERVER_H_
#define TRAINSUP_TESTS_COMMON_ETCD_SERVER_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "contracts/free_port.h"
#include "tests/common/temp_dir.h"

namespace trainsup::testing {

// A certificate authority and certificates for etcd over TLS, made with
// openssl in `dir`: etcd's server certificate (127.0.0.1 and localhost),
// a client certificate "node-a" from the same CA, and a client certificate
// "rogue" from a CA etcd does not trust. Paths to PEM files.
struct TestPki {
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string rogue_ca, rogue_cert, rogue_key;
};

inline absl::Status MakeTestPki(const std::string& dir, TestPki* pki) {
  const std::string log = dir + "/openssl.log";
  const auto run = [&](const std::string& command) {
    const std::string line = "/usr/bin/openssl " + command + " >>" + log + " 2>&1";
    if (std::system(line.c_str()) == 0) return absl::OkStatus();
    std::ifstream in(log);
    std::ostringstream text;
    text << in.rdbuf();
    return absl::InternalError(absl::StrCat("openssl ", command, " failed:\n", text.str()));
  };
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const auto ca = [&](const std::string& name) {
    return run("req -x509" + ec + " -keyout " + dir + "/" + name + ".key -out " + dir + "/" + name +
               ".pem -days 2 -subj /CN=" + name);
  };
  const auto issue = [&](const std::string& ca_name, const std::string& name,
                         const std::string& extensions) -> absl::Status {
    const std::string base = dir + "/" + name;
    std::ofstream(base + ".ext") << extensions << "\n";
    if (absl::Status s =
            run("req" + ec + " -keyout " + base + ".key -out " + base + ".csr -subj /CN=" + name);
        !s.ok()) {
      return s;
    }
    return run("x509 -req -in " + base + ".csr -CA " + dir + "/" + ca_name + ".pem -CAkey " + dir +
               "/" + ca_name + ".key -CAcreateserial -days 2 -out " + base + ".pem -extfile " +
               base + ".ext");
  };
  for (absl::Status s :
       {ca("test-ca"), ca("rogue-ca"),
        issue("test-ca", "etcd-server",
              "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        issue("test-ca", "node-a", "extendedKeyUsage=clientAuth"),
        issue("rogue-ca", "rogue", "extendedKeyUsage=clientAuth")}) {
    if (!s.ok()) return s;
  }
  *pki = {dir + "/test-ca.pem", dir + "/etcd-server.pem", dir + "/etcd-server.key",
          dir + "/node-a.pem",  dir + "/node-a.key",      dir + "/rogue-ca.pem",
          dir + "/rogue.pem",   dir + "/rogue.key"};
  return absl::OkStatus();
}

class EtcdServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  EtcdServer() : dir_("etcd_test") {
    client_port_ = FreeLoopbackPort(0);
    peer_port_ = FreeLoopbackPort(0);
    for (int i = 0; i < 10 && peer_port_ == client_port_; ++i) peer_port_ = FreeLoopbackPort(0);
  }
  ~EtcdServer() { Kill(); }

  // Serves clients over TLS from the next Start: `pki`'s server certificate,
  // client certificates from its CA required. /health is then asked on a
  // plain-HTTP metrics port of its own.
  // Serves clients on `host` too (an address of this namespace), same port.
  void ListenAlsoOn(const std::string& host) { also_on_ = host; }

  void UseTls(const TestPki& pki) {
    tls_ = pki;
    metrics_port_ = FreeLoopbackPort(0);
    for (int i = 0; i < 10 && (metrics_port_ == client_port_ || metrics_port_ == peer_port_); ++i) {
      metrics_port_ = FreeLoopbackPort(0);
    }
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // Starts etcd (again: same ports, same data) and waits until /health says
  // it serves, at most `timeout_s`. The error carries etcd's log.
  absl::Status Start(double timeout_s = 30) {
    if (pid_ > 0) return absl::FailedPreconditionError("etcd is already running");
    if (access(kBinary, X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(kBinary, " is missing: install the Debian package etcd-server"));
    }
    if (client_port_ <= 0 || peer_port_ <= 0 || client_port_ == peer_port_) {
      return absl::InternalError("no free loopback port for etcd");
    }
    std::string client_url = absl::StrCat(tls_ ? "https" : "http", "://127.0.0.1:", client_port_);
    if (!also_on_.empty()) {
      absl::StrAppend(&client_url, ",", tls_ ? "https" : "http", "://", also_on_, ":",
                      client_port_);
    }
    const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port_);
    std::vector<std::string> args = {kBinary,
                                     "--name=trainsup-test",
                                     "--data-dir=" + dir_.path() + "/data",
                                     "--listen-client-urls=" + client_url,
                                     "--advertise-client-urls=" + client_url,
                                     "--listen-peer-urls=" + peer_url,
                                     "--initial-advertise-peer-urls=" + peer_url,
                                     "--initial-cluster=trainsup-test=" + peer_url,
                                     "--logger=zap",
                                     "--log-outputs=stderr"};
    if (tls_) {
      for (std::string arg :
           {"--cert-file=" + tls_->server_cert, "--key-file=" + tls_->server_key,
            "--trusted-ca-file=" + tls_->ca, std::string("--client-cert-auth"),
            absl::StrCat("--listen-metrics-urls=http://127.0.0.1:", metrics_port_)}) {
        args.push_back(arg);
      }
    }
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int log = open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path()));
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      close(log);
      return absl::InternalError("fork failed");
    }
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      int null = open("/dev/null", O_RDONLY);
      if (null >= 0) dup2(null, STDIN_FILENO);
      execv(kBinary, argv.data());
      _exit(127);
    }
    close(log);
    pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(
            absl::StrCat("etcd exited while starting (status ", status, "); its log:\n", Log()));
      }
      if (Healthy()) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Kill();
    return absl::DeadlineExceededError(
        absl::StrCat("etcd did not become healthy within ", timeout_s, " s; its log:\n", Log()));
  }

  // SIGTERM, then waits (SIGKILL after 10 s).
  void Stop() {
    if (pid_ <= 0) return;
    if (Paused()) Resume();
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      pid_t reaped = waitpid(pid_, &status, WNOHANG);
      if (reaped == pid_ || (reaped < 0 && errno != EINTR)) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
  }

  // SIGKILL and reap.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    paused_ = false;
  }

  // SIGSTOP / SIGCONT: etcd stops answering but keeps its connections.
  // Returns once etcd has stopped: kill() only queues the signal, and etcd
  // could otherwise answer a call made right after Pause.
  void Pause() {
    if (pid_ <= 0 || kill(pid_, SIGSTOP) != 0) return;
    int status = 0;
    while (waitpid(pid_, &status, WUNTRACED) < 0 && errno == EINTR) {
    }
    paused_ = true;
  }
  void Resume() {
    if (pid_ > 0 && kill(pid_, SIGCONT) == 0) paused_ = false;
  }
  bool Paused() const { return paused_; }

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // "127.0.0.1:PORT", for MakeEtcdClient.
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }
  int client_port() const { return client_port_; }
  std::string data_dir() const { return dir_.path() + "/data"; }
  std::string log_path() const { return dir_.path() + "/etcd.log"; }
  // Everything etcd wrote, over all its starts.
  std::string Log() const {
    std::ifstream in(log_path());
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }

 private:
  // GET /health over plain HTTP/1.1: etcd answers {"health":"true",...}
  // once it has a leader and serves reads.
  bool Healthy() const {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    timeval timeout{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(tls_ ? metrics_port_ : client_port_));
    std::string response;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string request =
          "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
      if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
        char buffer[1024];
        ssize_t n;
        while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
      }
    }
    close(fd);
    return response.find("\"health\":\"true\"") != std::string::npos;
  }

  TempDir dir_;
  std::optional<TestPki> tls_;
  std::string also_on_;
  int metrics_port_ = 0;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
  bool paused_ = false;
};

}  // namespace trainsup::testing

#endif  // TRAINSUP_TESTS_COMMON_ETCD_SERVER_H_
