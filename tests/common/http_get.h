// A plain HTTP/1.0 GET on loopback, for the tests that read the daemon's
// /metrics or a Prometheus's API.
#ifndef TRAINSUP_TESTS_COMMON_HTTP_GET_H_
#define TRAINSUP_TESTS_COMMON_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace trainsup::testing {

// The whole HTTP/1.0 response (status line, headers, body) to GET `path`
// on 127.0.0.1:`port`; "" when the connection fails, and what came when
// nothing more comes within 10 s.
inline std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 10000) <= 0) break;
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        response.append(buf, n);
      }
    }
  }
  close(fd);
  return response;
}

}  // namespace trainsup::testing

#endif  // TRAINSUP_TESTS_COMMON_HTTP_GET_H_
