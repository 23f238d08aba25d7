#!/bin/bash
# Runs the daemon's integration tests (hardening_test, daemon_test,
# cluster_test, cluster_jobs_test and cluster_elastic_test: the etcd
# client's and the cluster member's threads) against
# a ThreadSanitizer build of trainsupd: the tests are the normal build's,
# the daemon they start is the TSan one (TRAINSUP_TEST_DAEMON).
# A race report stops the daemon (halt_on_error), so the test that met it
# fails, and the reports are left in build-tsan/tsan-logs/.
#
#   tests/integration/tsan/run.sh [gtest filter]     (default: every test)
#
# Not part of the default ctest run: the TSan build takes minutes on a
# 2-core machine. Races inside Debian's uninstrumented libraries are
# suppressed (suppressions.txt).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
filter=${1:-*}
cd "$root"
if [ ! -f build-tsan/CMakeCache.txt ]; then
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
fi
cmake --build build-tsan -j"$(nproc)" --target trainsupd
cmake --build build -j"$(nproc)" --target hardening_integration_test daemon_integration_test \
  cluster_integration_test cluster_jobs_integration_test cluster_elastic_integration_test
logs=build-tsan/tsan-logs
rm -rf "$logs" && mkdir -p "$logs"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/integration/tsan/suppressions.txt log_path=$root/$logs/tsan"
export TRAINSUP_TEST_DAEMON="$root/build-tsan/bin/trainsupd"
status=0
for t in hardening_integration_test daemon_integration_test cluster_integration_test \
  cluster_jobs_integration_test cluster_elastic_integration_test; do
  build/tests/integration/$t --gtest_filter="$filter" || status=$?
done
if compgen -G "$logs/tsan.*" >/dev/null; then
  echo "ThreadSanitizer reports:" && cat "$logs"/tsan.*
  exit 1
fi
exit "$status"
