// LD_PRELOAD shim for tests: getrandom(2) fills every buffer with the same
// recognisable pattern (byte i is 0xA5 ^ i), so a test can tell that a
// secret was taken straight from the kernel's CSPRNG.
#include <sys/types.h>

#include <cstddef>

extern "C" ssize_t getrandom(void* buf, size_t length, unsigned int) {
  auto* bytes = static_cast<unsigned char*>(buf);
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<unsigned char>(0xA5 ^ (i & 0xff));
  return static_cast<ssize_t>(length);
}
