#!/usr/bin/env bash
# Fetches the two real, labelled aerial LiDAR scans (CC0) that Debian's
# libcgal-demo package ships inside its tarballs, without installing it:
#
#   urban.las        examples/Point_set_processing_3/data/urban.las (in examples.tar.gz)
#                    13,511 points, LAS 1.2 point format 3, ASPRS classes
#                    1 unclassified, 2 ground, 4 medium vegetation
#   b9_training.ply  data/points_3/b9_training.ply (in data.tar.gz)
#                    22,300 points, binary PLY, property "label":
#                    -1 unlabelled, 0 ground, 1 vegetation, 2 roof
#
# Usage: deploy/fetch-sample-data.sh [--dest DIR] [--deb FILE] [--force]
#   --dest DIR  where the files go (default: data/samples in the repository)
#   --deb FILE  use this libcgal-demo .deb instead of downloading one
#   --force     fetch again even when the files are present
#
# Idempotent: files already present and sane are kept. Works without root
# (apt-get download needs only the package lists). When libcgal-demo is
# installed, its tarballs in /usr/share/doc/libcgal-dev are used directly.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$repo/data/samples"
deb=""
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) dest="$2"; shift 2 ;;
    --deb) deb="$(realpath "$2")"; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "fetch-sample-data: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done

say() { echo "fetch-sample-data: $*"; }
die() { echo "fetch-sample-data: error: $*" >&2; exit 1; }

# name|member path inside a tarball|expected point count
samples=(
  "urban.las|examples/Point_set_processing_3/data/urban.las|13511"
  "b9_training.ply|data/points_3/b9_training.ply|22300"
)

u32() { od -An -t u4 -j "$2" -N 4 "$1" | tr -d ' '; }
u16() { od -An -t u2 -j "$2" -N 2 "$1" | tr -d ' '; }

# Prints the point count of a sane sample; fails with the reason otherwise.
check_las() {
  local f="$1" size offset length count
  [ "$(head -c 4 "$f")" = "LASF" ] || { echo "no LASF magic"; return 1; }
  size=$(stat -c %s "$f")
  offset=$(u32 "$f" 96); length=$(u16 "$f" 105); count=$(u32 "$f" 107)
  [ $((offset + count * length)) -le "$size" ] ||
    { echo "$count points of $length bytes from $offset exceed $size bytes"; return 1; }
  echo "$count"
}
check_ply() {
  local f="$1" header count
  header=$(head -c 4096 "$f" | sed -n '1,/^end_header/p')
  [ "$(printf '%s\n' "$header" | head -n1)" = "ply" ] || { echo "no ply magic"; return 1; }
  printf '%s\n' "$header" | grep -q '^end_header' || { echo "no end_header"; return 1; }
  printf '%s\n' "$header" | grep -q '^property .* label$' || { echo "no label property"; return 1; }
  count=$(printf '%s\n' "$header" | sed -n 's/^element vertex \([0-9]*\)$/\1/p')
  [ -n "$count" ] || { echo "no vertex element"; return 1; }
  # At least x y z as float per vertex after the header.
  [ $(( $(stat -c %s "$f") - ${#header} - 1 )) -ge $((count * 12)) ] ||
    { echo "body too short for $count vertices"; return 1; }
  echo "$count"
}
check() {
  case "$1" in
    *.las) check_las "$1" ;;
    *.ply) check_ply "$1" ;;
    *) echo "no check for $1"; return 1 ;;
  esac
}

mkdir -p "$dest"
todo=()
for s in "${samples[@]}"; do
  IFS='|' read -r name member expected <<<"$s"
  if [ "$force" -eq 0 ] && [ -f "$dest/$name" ] && count=$(check "$dest/$name"); then
    say "$dest/$name present ($count points), skipped"
  else
    todo+=("$s")
  fi
done
[ ${#todo[@]} -gt 0 ] || { say "nothing to do"; exit 0; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

docdir=/usr/share/doc/libcgal-dev
if [ -z "$deb" ] && ls "$docdir"/*.tar.gz >/dev/null 2>&1; then
  say "using the installed libcgal-demo tarballs in $docdir"
  tarballs=("$docdir"/*.tar.gz)
else
  if [ -z "$deb" ]; then
    say "downloading libcgal-demo with apt-get download (no install)"
    if ! out=$(cd "$tmp" && apt-get download libcgal-demo 2>&1); then
      printf '%s\n' "$out" >&2
      die "apt-get download libcgal-demo failed (run apt-get update? or pass --deb FILE)"
    fi
    printf '%s\n' "$out" | grep -v '^W: Download is performed unsandboxed' || true
    deb=$(ls "$tmp"/libcgal-demo_*.deb)
  fi
  say "package: $(basename "$deb") ($(stat -c %s "$deb") bytes)"
  mapfile -t members < <(dpkg-deb -c "$deb" | awk '{print $NF}' | grep '\.tar\.gz$')
  [ ${#members[@]} -gt 0 ] || die "$deb holds no tarballs"
  say "tarballs in the package: ${members[*]}"
  dpkg-deb -x "$deb" "$tmp/x"
  tarballs=()
  for m in "${members[@]}"; do tarballs+=("$tmp/x/${m#./}"); done
fi

for s in "${todo[@]}"; do
  IFS='|' read -r name member expected <<<"$s"
  found=""
  for t in "${tarballs[@]}"; do
    # No grep -q: it would stop reading early and fail the pipe (pipefail).
    if tar -tzf "$t" | grep -x "$member" >/dev/null; then found="$t"; break; fi
  done
  [ -n "$found" ] || die "no tarball holds $member"
  tar -xzOf "$found" "$member" >"$dest/.partial.$name"
  if ! count=$(check "$dest/.partial.$name"); then
    rm -f "$dest/.partial.$name"
    die "$member from $(basename "$found") is not sane: $count"
  fi
  mv "$dest/.partial.$name" "$dest/$name"
  say "extracted $member from $(basename "$found") to $dest/$name ($(stat -c %s "$dest/$name") bytes, $count points)"
  if [ "$count" != "$expected" ]; then
    say "warning: $name has $count points, expected $expected (another libcgal-demo version?)"
  fi
done
