# shellcheck shell=bash
# Sourced by tests/gpu/run.sh and tests/gpu/bench_vs_spconv.sh: what both
# need to run on a GPU machine lent through the device tool, which kills a
# command at its limit and returns at most 8 files from $OUT.
#
#   gpu_begin TAG FOLDER SECONDS MARGIN
#       starts the clock, empties FOLDER (the script's results), opens
#       FOLDER/TAG.log and sets one deadline SECONDS from now; `left` keeps
#       MARGIN seconds of it for the summary.
#   say MESSAGE...    progress, to stderr and the log, with the seconds so far
#   left CAP          the smaller of CAP and the seconds left (at least 1)
#   publish JSON      prints JSON; with $OUT set, also writes it to
#                     $OUT/TAG.json and packs FOLDER into $OUT/TAG.tgz:
#                     two files, whatever the stages wrote.

gpu_begin() {
  tag=$1
  out=$2
  start=$(date +%s)
  deadline=$((start + $3))
  margin=$4
  rm -rf "$out"
  mkdir -p "$out"
  log="$out/$tag.log"
  : >"$log"
}

say() { echo "[$tag $(($(date +%s) - start)) s] $*" | tee -a "$log" >&2; }

left() {
  local l=$((deadline - $(date +%s) - margin))
  ((l < 1)) && l=1
  ((l < $1)) && echo "$l" || echo "$1"
}

publish() {
  printf '%s\n' "$1"
  if [[ -n ${OUT:-} ]]; then
    printf '%s\n' "$1" >"$OUT/$tag.json"
    tar -C "$out" -czf "$OUT/$tag.tgz" . || echo "$tag: could not pack $out into $OUT" >&2
  fi
}
