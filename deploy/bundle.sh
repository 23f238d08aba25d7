#!/usr/bin/env bash
# Bundles trainsupd, trainctl and trainsup-worker with every shared library
# they need that a GPU machine's image may lack, for a machine that has
# torch and Python but not gRPC, Protobuf, Boost or Debian's packages (the
# lent GPU machine, docs/building.md "The GPU bundle"; issue 41).
#
# Carried: every library ldd resolves for the three programs, except glibc's
# (libc, libm, libpthread, libdl, librt, libresolv, ld-linux: the machine's
# own, always newer than Debian 12's) and torch's (anything from the torch
# environment's site-packages: torch/lib and nvidia/*: the machine's torch
# serves them, of the same version). Each binary and library gets the RPATH
# $ORIGIN/../lib and is stripped. The Python client (with its generated
# stubs) goes to python/, so a script there imports it with grpcio and
# protobuf of the machine's own Python.
#
# The worker finds torch through LD_LIBRARY_PATH: `bin/torch-libs PYTHON`
# prints the directories of that Python's torch (torch/lib and its nvidia
# libraries) for it; trainsupd passes LD_LIBRARY_PATH on to its workers.
#
# Usage: deploy/bundle.sh --build DIR --out DIR [--tar]
#   --build DIR  a build tree with bin/trainsupd, bin/trainctl,
#                bin/trainsup-worker and python/venv (the main build, or
#                one made against the GPU machine's torch version:
#                deploy/build-gpu-bundle.sh)
#   --out DIR    made anew: bin/, lib/, python/, MANIFEST.txt
#   --tar        also DIR.tar.xz, and its size checked against the 64 MiB a
#                device call carries (at most 48 MiB, leaving room for the
#                tree and the data)
# Exit 0 with the bundle; 1 naming what is missing.
set -euo pipefail

build="" out="" tar=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --tar) tar=1; shift ;;
    *) echo "bundle.sh: unknown argument '$1' (--build DIR --out DIR [--tar])" >&2; exit 64 ;;
  esac
done
[ -n "$build" ] && [ -n "$out" ] || { echo "bundle.sh: --build and --out are required" >&2; exit 64; }
fail() { echo "bundle.sh: $*" >&2; exit 1; }
command -v patchelf >/dev/null || fail "patchelf is missing (deploy/bootstrap.sh installs it)"

programs=(trainsupd trainctl trainsup-worker)
for p in "${programs[@]}"; do
  [ -x "$build/bin/$p" ] || fail "$build/bin/$p is missing: build the tree first"
done
site=$(ls -d "$build"/python/venv/lib/python3*/site-packages 2>/dev/null | head -1 || true)
[ -n "$site" ] && [ -d "$site/trainsup" ] || fail "$build/python/venv has no trainsup client"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/python"

# glibc's libraries: never carried.
is_glibc() {
  case "$(basename "$1")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|ld-linux*|\
    libutil.so.*|libanl.so.*|libnsl.so.*) return 0 ;;
  esac
  return 1
}
# torch's (its own environment's): never carried.
is_torchs() {
  case "$1" in
    */site-packages/torch/*|*/site-packages/nvidia/*|*/site-packages/triton/*) return 0 ;;
  esac
  return 1
}

declare -A carried=()
for p in "${programs[@]}"; do
  cp "$build/bin/$p" "$out/bin/$p"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then fail "$p needs $name, which is not found here"; fi
    is_glibc "$path" && continue
    is_torchs "$path" && continue
    carried[$name]=$path
  done < <(ldd "$build/bin/$p")
done
for name in "${!carried[@]}"; do
  cp -L "${carried[$name]}" "$out/lib/$name"
  chmod u+w "$out/lib/$name"
done
for f in "$out"/bin/* "$out"/lib/*; do
  strip --strip-unneeded "$f" 2>/dev/null || strip "$f"
  patchelf --set-rpath '$ORIGIN/../lib' "$f"
done

cp -r "$site/trainsup" "$out/python/trainsup"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +

cat >"$out/bin/torch-libs" <<'SH'
#!/bin/sh
# Prints the library directories of PYTHON's torch (torch/lib, then its
# nvidia/*/lib), and last this bundle's lib/, joined with ':', for
# LD_LIBRARY_PATH. The bundle's lib/ comes last for what torch's own
# libraries need but do not ship: the wheel's libgfortran needs the
# system's libquadmath, which a bare image may lack.
# Usage: torch-libs [PYTHON]   (default python3)
bundle_lib=$(cd "$(dirname "$0")/../lib" && pwd)
exec "${1:-python3}" - "$bundle_lib" <<'PY'
import glob, os, sys, torch
base = os.path.dirname(torch.__file__)
dirs = [os.path.join(base, "lib")]
dirs += sorted(glob.glob(os.path.join(os.path.dirname(base), "nvidia", "*", "lib")))
dirs += sorted(glob.glob(os.path.join(os.path.dirname(base), "nvidia", "*", "*", "lib")))
dirs.append(sys.argv[1])
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
SH
chmod +x "$out/bin/torch-libs"

{
  echo "trainsup bundle of $(cat "$(dirname "$0")/../VERSION") from $build"
  echo "programs: ${programs[*]}"
  echo "libraries carried (${#carried[@]}):"
  for name in $(printf '%s\n' "${!carried[@]}" | sort); do echo "  $name <- ${carried[$name]}"; done
  echo "size: $(du -sh "$out" | cut -f1)"
} >"$out/MANIFEST.txt"

if [ "$tar" -eq 1 ]; then
  tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -9 -T2 >"$out.tar.xz"
  bytes=$(stat -c %s "$out.tar.xz")
  echo "size of $out.tar.xz: $((bytes / 1024 / 1024)) MiB" >>"$out/MANIFEST.txt"
  [ "$bytes" -le $((48 * 1024 * 1024)) ] ||
    fail "$out.tar.xz is $((bytes / 1024 / 1024)) MiB: over the 48 MiB that leave room in a device call"
fi
cat "$out/MANIFEST.txt"
