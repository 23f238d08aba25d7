#!/usr/bin/env bash
# Builds the Debian package from the build tree (cpack) and checks what it
# holds and declares: the files, the conffile, the maintainer scripts, the
# version (the repository's VERSION, also the changelog's), dependencies
# computed by dpkg-shlibdeps from the binaries, and no worker, no LibTorch.
# Usage: deb_contents.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
fail() { echo "deb_contents: FAIL: $*" >&2; exit 1; }

version=$(cat "$src/VERSION")
rm -rf "$build/package"
cpack --config "$build/CPackConfig.cmake" -B "$build/package" >"$build/package-cpack.log" 2>&1 ||
  { cat "$build/package-cpack.log" >&2; fail "cpack failed"; }
arch=$(dpkg --print-architecture)
deb="$build/package/trainsup_${version}_${arch}.deb"
[ -f "$deb" ] || fail "no $deb (cpack made: $(ls "$build/package"))"

field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = trainsup ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version: $(field Version), VERSION says $version"
head -1 "$src/deploy/debian/changelog" | grep -q "^trainsup ($version) " ||
  fail "deploy/debian/changelog's top entry is not version $version: $(head -1 "$src/deploy/debian/changelog")"
depends=$(field Depends)
echo "Depends: $depends"
# From dpkg-shlibdeps (the binaries link these), not listed by hand.
for lib in 'libgrpc++1.51' libprotobuf32 libsqlite3-0 libsystemd0 libc6; do
  grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib (shlibdeps): $depends"
done
for dep in adduser python3-grpcio python3-protobuf python3-xxhash; do
  grep -q "$dep" <<<"$depends" || fail "Depends lacks $dep: $depends"
done

contents=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|')
for path in /usr/bin/trainsupd /usr/bin/trainctl /lib/systemd/system/trainsupd.service \
            /etc/trainsup/trainsupd.toml /usr/share/bash-completion/completions/trainctl \
            /usr/share/man/man8/trainsupd.8.gz /usr/share/man/man1/trainctl.1.gz \
            /usr/share/doc/trainsup/copyright /usr/share/doc/trainsup/changelog.gz \
            /usr/share/doc/trainsup/operations.md \
            /usr/lib/python3/dist-packages/trainsup/__init__.py \
            /usr/lib/python3/dist-packages/trainsup/_version.py \
            /usr/lib/python3/dist-packages/trainsup/v1/worker_pb2.py \
            "/usr/lib/python3/dist-packages/trainsup-$version.dist-info/METADATA"; do
  grep -qx "$path" <<<"$contents" || fail "the package lacks $path"
done
if grep -E 'trainsup-worker|libtorch|\.pyc$' <<<"$contents"; then
  fail "the package holds the worker, LibTorch or byte code"
fi

ctrl=$(mktemp -d)
trap 'rm -rf "$ctrl"' EXIT
dpkg-deb -e "$deb" "$ctrl"
[ "$(cat "$ctrl/conffiles")" = /etc/trainsup/trainsupd.toml ] || fail "conffiles: $(cat "$ctrl/conffiles")"
for script in postinst prerm postrm; do
  [ -x "$ctrl/$script" ] || fail "no executable $script"
  cmp -s "$ctrl/$script" "$src/deploy/debian/$script" || fail "$script differs from deploy/debian/$script"
done
# The binaries are stripped and reach no LibTorch.
x=$(mktemp -d)
dpkg-deb -x "$deb" "$x"
for bin in trainsupd trainctl; do
  if readelf -d "$x/usr/bin/$bin" | grep -qiE 'torch|c10'; then fail "$bin links LibTorch"; fi
  if readelf -S "$x/usr/bin/$bin" | grep -q '\.debug_info'; then fail "$bin is not stripped"; fi
  "$x/usr/bin/$bin" --version | grep -qx "$bin $version" || fail "$bin --version: $("$x/usr/bin/$bin" --version)"
done
grep -q "__version__ = '$version'" "$x/usr/lib/python3/dist-packages/trainsup/_version.py" ||
  fail "the client's _version.py: $(cat "$x/usr/lib/python3/dist-packages/trainsup/_version.py")"
rm -rf "$x"
echo "deb_contents: OK: $deb ($(du -k "$deb" | cut -f1) KiB)"
