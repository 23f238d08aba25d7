// toml++'s implementation, compiled into the fuzz build (see CMakeLists.txt).
#define TOML_IMPLEMENTATION
#include <toml++/toml.h>
