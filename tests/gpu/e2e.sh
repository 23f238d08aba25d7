#!/usr/bin/env bash
# The whole product on a GPU machine, in one prepared device run (issue 41):
# the bundled trainsupd supervises the bundled trainsup-worker and a user's
# Python script on the machine's GPU, in seven stages:
#   1 nvml         trainctl node lists the GPU, read through NVML; the
#                  daemon's log names the NVML it loaded
#   2 killed       a MinkUNet14 run on the sample scan; its worker is
#                  SIGKILLed mid-run; it resumes from its newest checkpoint
#                  and ends SUCCEEDED; figures: exit -> GPU free -> relaunch
#   3 oom_split    a batch that does not fit the run's memory budget (the
#                  caching allocator's fraction on a GPU) splits: SUCCEEDED,
#                  splits > 0, out-of-memory retries > 0, no OOM restart
#   4 stranded     a foreign torch process holds the GPU when the worker
#                  ends: the slot is STRANDED naming its pid and the run
#                  waits; the holder exits, the run goes on. Then again with
#                  slots.drain_stranded_after_s: the slot is drained
#   5 script       e2e_train.py with the Python client from the bundle:
#                  crashes once, resumes, SUCCEEDED; a torch.OutOfMemoryError
#                  exits 75 and is recorded as an out-of-memory restart
#   6 nccl         a gang with backend "nccl" trains a few steps (world size
#                  = the GPUs there are; on the CPU: a Gloo gang of 2)
#   7 determinism  two runs, same seed, deterministic: are the checkpoints
#                  byte-identical?
# Each stage runs under its own deadline (the smaller of its cap and the
# time left of DEADLINE), in its own daemon and state directory, and writes
# LOGS/STAGE/result.json; the script prints one JSON summary on stdout.
#
# --cpu-only (CI, tests/gpu/CMakeLists.txt): the same stages on this
# machine's CPU, with the fake GPU file (`[testing] fake_gpu_file`) in place
# of NVML; what needs a device is skipped with its reason, so a broken path
# of this script fails here, not in the device's few minutes.
#
# Usage:
#   tests/gpu/e2e.sh [--cpu-only] [--bundle DIR|FILE.tar.xz] [--logs DIR]
#                    [--python PYTHON] [--data FILE.las]
#   --bundle  deploy/bundle.sh's output (default: .gpu/trainsup.tar.xz, made
#             by tests/gpu/prepare-e2e.sh; --cpu-only: the main build,
#             bundled anew into build/e2e-bundle/trainsup)
#   --logs    where the logs go (default: $OUT, else build/e2e)
#   --python  a Python with torch, grpcio, protobuf and xxhash (default:
#             python3; --cpu-only: /opt/trainsup/venv/bin/python3)
#   --data    the labelled scan (default: data/samples/urban.las)
# DEADLINE (seconds): the whole run; default 470 on a GPU, 1500 --cpu-only.
# Exit 0 when no stage failed (skips allowed), 1 otherwise, 64 on bad usage.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
self="$root/tests/gpu/e2e.sh"

# ---- arguments --------------------------------------------------------------
if [[ ${1:-} == --stage ]]; then
  stage_only=$2
  shift 2
else
  stage_only=""
fi
mode=${E2E_MODE:-gpu}
bundle=${E2E_BUNDLE:-} logs=${E2E_LOGS:-} python=${E2E_PYTHON:-} data=${E2E_DATA:-}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu-only) mode=cpu; shift ;;
    --bundle) bundle=${2:?--bundle needs a value}; shift 2 ;;
    --logs) logs=${2:?--logs needs a value}; shift 2 ;;
    --python) python=${2:?--python needs a value}; shift 2 ;;
    --data) data=${2:?--data needs a value}; shift 2 ;;
    *) echo "e2e.sh: unknown argument '$1' (see the usage at the top of $self)" >&2; exit 64 ;;
  esac
done

say() { echo "e2e: $*" >&2; }

# ---- what every stage shares --------------------------------------------------
# result STATUS REASON [JSON-FIGURES]: this stage's result.json.
result() {
  "$python" - "$logs/$stage_only/result.json" "$stage_only" "$1" "$2" "${3:-{\}}" <<'PY'
import json, sys
path, name, status, reason, figures = sys.argv[1:6]
out = {"stage": name, "status": status, "reason": reason}
out.update(json.loads(figures))
json.dump(out, open(path, "w"), indent=1)
PY
}
pass() { result passed "$@"; exit 0; }
skip() { result skipped "$@"; exit 0; }
failstage() { result failed "$@"; say "$stage_only FAILED: $1"; exit 1; }

# jget FILE EXPR: EXPR (Python, over d = the file's JSON) printed.
jget() { "$python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

# The daemon of this stage: config from the arguments' TOML lines added to
# the common ones. Sets state, sock, ctl (a function), daemon_pid.
start_daemon() {
  state="$sdir/state"
  mkdir -p "$state"
  {
    echo "[daemon]"
    echo "state_dir = \"$state\""
    echo "worker_binary = \"$bin/trainsup-worker\""
    echo "data_roots = [\"$(dirname "$data")\", \"$sdir\"]"
    echo "[slots]"
    echo "use_gpus = true"
    echo "gpu_release_timeout_s = ${RELEASE_TIMEOUT_S:-10}"
    echo "drain_stranded_after_s = ${DRAIN_STRANDED_AFTER_S:-0}"
    echo "[restart]"
    echo "initial_backoff_s = 1"
    echo "[commands]"
    echo "allowed_programs = [\"$python\"]"
    echo "allow_env = [\"PYTHONPATH\"]"
    echo "[testing]"
    echo "allow_fault_injection = true"
    [[ $mode == cpu ]] && echo "fake_gpu_file = \"$sdir/gpus.json\""
  } >"$sdir/trainsupd.toml"
  LD_LIBRARY_PATH="$libs" OMP_WAIT_POLICY=PASSIVE \
    "$bin/trainsupd" --config "$sdir/trainsupd.toml" 2>"$sdir/trainsupd.log" &
  daemon_pid=$!
  sock="$state/run/trainsupd.sock"
  for _ in $(seq 1 100); do
    [[ -S $sock && -s $state/auth/operator.token ]] && return 0
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  failstage "trainsupd did not start (log: $sdir/trainsupd.log)"
}
ctl() { "$bin/trainctl" --socket "$sock" --token-file "$state/auth/operator.token" --timeout 30 "$@"; }
# Everything this stage started: the daemon, then any process that still
# names its directory (workers, holders).
stop_all() {
  [[ -n ${daemon_pid:-} ]] && kill -TERM "$daemon_pid" 2>/dev/null
  sleep 0.5
  pkill -KILL -f -- "$sdir/" 2>/dev/null
  [[ -n ${holder_pid:-} ]] && kill -KILL "$holder_pid" 2>/dev/null
  [[ -n ${daemon_pid:-} ]] && kill -KILL "$daemon_pid" 2>/dev/null
  wait 2>/dev/null
}

# fake_gpus COUNT [MIB_USED PID]: the fake GPU file (--cpu-only): COUNT GPUs
# of 80 GiB, the first one holding MIB_USED and PID when given.
fake_gpus() {
  [[ $mode == cpu ]] || return 0
  "$python" - "$sdir/gpus.json" "$@" <<'PY'
import json, os, sys
path, count = sys.argv[1], int(sys.argv[2])
used = int(sys.argv[3]) if len(sys.argv) > 3 else 0
pid = int(sys.argv[4]) if len(sys.argv) > 4 else 0
gpus = [{"uuid": f"GPU-e2e-{i}", "name": "Fake e2e GPU", "memory_total": 80 << 30,
         "memory_used": (used << 20) if i == 0 else 0,
         "compute_pids": [pid] if (i == 0 and pid) else []} for i in range(count)]
json.dump({"gpus": gpus}, open(path + ".tmp", "w"))
os.replace(path + ".tmp", path)
PY
}

# A MinkUNet14 spec on the sample scan: write_spec FILE NAME STEPS [TOML...]
write_spec() {
  local file=$1 name=$2 steps=$3
  shift 3
  local device=cuda threads=4
  [[ $mode == cpu ]] && device=cpu threads=2
  {
    echo "name = \"$name\""
    [[ -n ${WORLD:-} ]] && echo "world_size = $WORLD"
    echo "[model]"
    echo "arch = \"minkunet14\""
    if [[ -n ${SYNTHETIC:-} ]]; then
      echo "in_channels = 3"
      echo "voxel_size = 0.05"
      echo "[data]"
      echo "format = \"synthetic\""
      echo "scenes = 16"
      echo "scene_size = \"$SYNTHETIC\""
    else
      echo "in_channels = 2"
      echo "voxel_size = 0.5"
      echo "height_feature = true"
      echo "[data]"
      echo "format = \"las\""
      echo "path = \"$data\""
      echo "val_fraction = 0.25"
      echo "use_features = false"
      echo "tile_size = 20"
    fi
    echo "[optimizer]"
    echo "kind = \"sgd\""
    echo "lr = 0.05"
    echo "[train]"
    echo "batch_size = ${BATCH:-4}"
    echo "steps = $steps"
    echo "threads = $threads"
    echo "device = \"$device\""
    for line in "$@"; do echo "$line"; done
    # A few dozen steps show supervision, not learning: the run is not
    # judged against the majority-class baseline (docs/guard.md).
    echo "[guard]"
    echo "fail_below_baseline = false"
  } >"$file"
}

# describe RUN: the run's JSON into $sdir/run.json.
describe() { ctl -o json describe "$1" >"$sdir/run.json"; }
# wait_step RUN STEP: until the run reports STEP (0 when it ended first).
wait_step() {
  while true; do
    describe "$1" || return 1
    [[ $(jget "$sdir/run.json" "d.get('ended_ms','0') != '0'") == True ]] && return 1
    (($(jget "$sdir/run.json" "int(d.get('progress',{}).get('step','0'))") >= $2)) && return 0
    sleep 0.2
  done
}
# slot_state: slot 0's state and reason, "STATE|reason".
slot_state() {
  ctl -o json node >"$sdir/node.json" || return 1
  jget "$sdir/node.json" "d['slots'][0]['state'] + '|' + d['slots'][0].get('reason','') + '|' + d['slots'][0].get('drain_source','')"
}

# A process that holds GPU 0: on a GPU a torch process with most of its
# free memory; --cpu-only a sleeping process the fake file names. Sets
# holder_pid.
start_holder() {
  if [[ $mode == gpu ]]; then
    "$python" -c '
import os, sys, time, torch
free, total = torch.cuda.mem_get_info()
x = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")
print(f"holding {x.numel() >> 20} MiB", flush=True)
open(sys.argv[1], "w").write("ready")
time.sleep(600)' "$sdir/holder.ready" >"$sdir/holder.log" 2>&1 &
    holder_pid=$!
    for _ in $(seq 1 300); do [[ -f $sdir/holder.ready ]] && return 0; sleep 0.1; done
    failstage "the holder did not take the GPU (log: $sdir/holder.log)"
  else
    bash -c "exec -a holder-$sdir/ sleep 600" &
    holder_pid=$!
    fake_gpus 1 40000 "$holder_pid"
  fi
}
stop_holder() {
  kill -KILL "$holder_pid" 2>/dev/null
  wait "$holder_pid" 2>/dev/null
  fake_gpus 1
}

# ---- the stages -------------------------------------------------------------
stage_nvml() {
  fake_gpus 1
  start_daemon
  ctl node >"$sdir/node.txt" || failstage "trainctl node failed"
  ctl -o json node >"$sdir/node.json" || failstage "trainctl -o json node failed"
  local gpus
  gpus=$(jget "$sdir/node.json" "len(d.get('gpus', []))")
  ((gpus >= 1)) || failstage "trainctl node lists no GPU"
  local source
  source=$(grep -o 'GPUs: .*' "$sdir/trainsupd.log" | head -1)
  local figures
  figures=$(jget "$sdir/node.json" "__import__('json').dumps({'gpus': len(d['gpus']), 'gpu0': d['gpus'][0], 'nvml': d.get('nvml', False)})")
  figures=$("$python" -c 'import json,sys; f=json.loads(sys.argv[1]); f["daemon_log"]=sys.argv[2]; print(json.dumps(f))' "$figures" "$source")
  if [[ $mode == gpu ]]; then
    [[ $source == "GPUs: NVML from /"* ]] || failstage "the daemon's log does not name the NVML it loaded: '$source'" "$figures"
    [[ $(jget "$sdir/node.json" "d.get('nvml', False)") == True ]] || failstage "the node says nvml = false" "$figures"
    pass "$gpus GPU(s) through NVML" "$figures"
  fi
  [[ $source == "GPUs: the fake GPU file "* ]] || failstage "the daemon's log does not name the fake GPU file: '$source'" "$figures"
  pass "the fake GPU file listed (NVML needs a driver: not checked here)" "$figures"
}

stage_killed() {
  fake_gpus 1
  start_daemon
  write_spec "$sdir/spec.toml" e2e-killed 40 "checkpoint_every_steps = 10"
  local id
  id=$(ctl submit "$sdir/spec.toml") || failstage "submit failed"
  wait_step "$id" 15 || failstage "the run ended or vanished before step 15"
  local pid
  pid=$(jget "$sdir/run.json" "d['attempts'][-1]['ranks'][0]['pid']")
  kill -KILL "$pid" || failstage "could not kill worker $pid"
  say "killed worker $pid at step $(jget "$sdir/run.json" "d['progress']['step']")"
  ctl watch "$id" >"$sdir/watch.txt" 2>&1
  describe "$id"
  local end attempts resumed
  end=$(jget "$sdir/run.json" "d['state']")
  attempts=$(jget "$sdir/run.json" "len(d['attempts'])")
  resumed=$(jget "$sdir/run.json" "d['attempts'][-1].get('resumed_from_step','-1')")
  # Exit -> GPU free -> relaunch, from the daemon's log (its clock).
  local figures
  figures=$("$python" - "$sdir/trainsupd.log" "$pid" <<'PY'
import datetime, json, re, sys
log, pid = open(sys.argv[1]).read().splitlines(), sys.argv[2]
def t(line):
    return datetime.datetime.fromisoformat(line.split()[0]).timestamp()
ended = next((t(l) for l in log if f"pid {pid} ended" in l), None)
free = next((l for l in log if ended and " free " in l and "after its worker ended" in l and t(l) >= ended), None)
relaunch = next((t(l) for l in log if ended and "started pid" in l and "from step" in l and t(l) >= ended), None)
out = {}
if ended and free:
    out["exit_to_gpu_free_s"] = round(t(free) - ended, 3)
    out["gpu_free_line"] = free.split(" info ", 1)[-1]
    if relaunch:
        out["gpu_free_to_relaunch_s"] = round(relaunch - t(free), 3)
if ended and relaunch:
    out["exit_to_relaunch_s"] = round(relaunch - ended, 3)
print(json.dumps(out))
PY
)
  figures=$("$python" -c 'import json,sys; f=json.loads(sys.argv[1]); f.update(attempts=int(sys.argv[2]), resumed_from_step=int(sys.argv[3])); print(json.dumps(f))' "$figures" "$attempts" "$resumed")
  [[ $end == RUN_STATE_SUCCEEDED ]] || failstage "the run ended $end" "$figures"
  ((attempts == 2)) || failstage "$attempts attempts, expected 2" "$figures"
  ((resumed >= 10)) || failstage "attempt 2 resumed from step $resumed, not a checkpoint" "$figures"
  pass "killed at step >= 15, resumed from step $resumed, SUCCEEDED" "$figures"
}

stage_oom_split() {
  fake_gpus 1
  start_daemon
  # The budget, from a probe run: what stays between steps (the model, its
  # gradients, the optimizer's state: the memory in use after a step) plus
  # half of what a batch adds at its peak. A piece fits, the whole batch
  # does not. Synthetic large scenes: the sample scan's tiles are too small
  # for their activations to outweigh the model's state.
  SYNTHETIC=large BATCH=4 write_spec "$sdir/probe.toml" e2e-probe 3 "checkpoint_every_steps = 0"
  local id peak budget kept
  id=$(ctl submit "$sdir/probe.toml") || failstage "submit failed"
  ctl watch "$id" >"$sdir/probe.txt" 2>&1 || failstage "the probe run failed"
  describe "$id"
  # The run's progress, or its rank's (the run's last may be the exit's).
  peak=$(jget "$sdir/run.json" "max([int(d['progress'].get('memory_peak_bytes', 0))] + [int(r.get('progress', {}).get('memory_peak_bytes', 0)) for a in d['attempts'] for r in a['ranks']])")
  kept=$(jget "$sdir/run.json" "max(int(r.get('progress', {}).get('memory_current_bytes', 0)) for a in d['attempts'] for r in a['ranks'])")
  ((peak > 0 && kept > 0 && kept < peak)) || failstage "the probe run reported no memory figures (peak $peak, in use $kept)"
  budget=$(((kept + (peak - kept) / 2) >> 20))
  say "probe: $((kept >> 20)) MiB kept between steps, peak $((peak >> 20)) MiB: budget $budget MiB"
  SYNTHETIC=large BATCH=4 write_spec "$sdir/spec.toml" e2e-oom 6 "checkpoint_every_steps = 0" \
    "memory_budget_mb = $budget" "predictive_split = false"
  id=$(ctl submit "$sdir/spec.toml") || failstage "submit failed"
  ctl watch "$id" >"$sdir/watch.txt" 2>&1
  describe "$id"
  local figures
  figures=$(jget "$sdir/run.json" "__import__('json').dumps({'probe_peak_mib': $peak >> 20, 'probe_kept_mib': $kept >> 20, 'budget_mib': $budget, 'state': d['state'], 'attempts': len(d['attempts']), 'oom_restarts': d.get('oom_restarts', 0), 'splits': int(d['progress']['splits']), 'oom_retries': int(d['progress']['oom_retries']), 'wasted_forwards': int(d['progress']['wasted_forwards']), 'dropped_pieces': int(d['progress']['dropped_pieces']), 'peak_mib': int(d['progress']['memory_peak_bytes']) >> 20})")
  [[ $(jget "$sdir/run.json" "d['state']") == RUN_STATE_SUCCEEDED ]] || failstage "the run did not succeed" "$figures"
  [[ $(jget "$sdir/run.json" "len(d['attempts']) == 1 and d.get('oom_restarts', 0) == 0") == True ]] ||
    failstage "an out-of-memory restart was recorded" "$figures"
  [[ $(jget "$sdir/run.json" "int(d['progress']['splits']) > 0 and int(d['progress']['oom_retries']) > 0") == True ]] ||
    failstage "no split after an out-of-memory error" "$figures"
  # Every piece trained: a dropped piece is data the step did not see.
  [[ $(jget "$sdir/run.json" "int(d['progress']['dropped_pieces'])") == 0 ]] ||
    failstage "pieces were dropped under the budget" "$figures"
  # Split equals unsplit on CUDA: the worker's trainer tests check it on the
  # CPU (tests/worker/train/trainer_test.cc); this script carries no test
  # binary built for the device's torch, so it is not checked here.
  pass "split under a ${budget} MiB budget, no restart (split = unsplit gradient: not checked by this script)" "$figures"
}

stage_stranded() {
  fake_gpus 1
  start_holder
  RELEASE_TIMEOUT_S=3 start_daemon
  write_spec "$sdir/spec.toml" e2e-stranded 12 "checkpoint_every_steps = 4" \
    "[testing]" "exit_at_step = 6" "exit_code = 3" "only_attempt = 1"
  local id seen=""
  id=$(ctl submit "$sdir/spec.toml") || failstage "submit failed"
  for _ in $(seq 1 600); do
    seen=$(slot_state) || true
    [[ $seen == SLOT_STATE_STRANDED* ]] && break
    sleep 0.2
  done
  [[ $seen == SLOT_STATE_STRANDED* ]] || failstage "slot 0 never STRANDED (last: $seen)"
  [[ $seen == *"$holder_pid"* ]] || failstage "the stranded slot does not name holder $holder_pid: $seen"
  describe "$id"
  local waiting
  waiting=$(jget "$sdir/run.json" "d['state']")
  [[ $waiting != RUN_STATE_RUNNING && $waiting != RUN_STATE_SUCCEEDED ]] ||
    failstage "the run did not wait for the stranded slot: $waiting"
  stop_holder
  ctl watch "$id" >"$sdir/watch.txt" 2>&1
  describe "$id"
  [[ $(jget "$sdir/run.json" "d['state']") == RUN_STATE_SUCCEEDED ]] ||
    failstage "after the holder exited the run ended $(jget "$sdir/run.json" "d['state']")"
  local first=$seen first_holder=$holder_pid
  stop_all
  daemon_pid=""

  # Again with drain_stranded_after_s: the slot is drained.
  sdir="$sdir/drain"
  mkdir -p "$sdir"
  fake_gpus 1
  start_holder
  RELEASE_TIMEOUT_S=2 DRAIN_STRANDED_AFTER_S=2 start_daemon
  id=$(ctl submit "$sdir/../spec.toml") || failstage "submit failed"
  for _ in $(seq 1 600); do
    seen=$(slot_state) || true
    [[ $seen == *"|stranded" ]] && break
    sleep 0.2
  done
  [[ $seen == *"|stranded" ]] || failstage "slot 0 was not drained for being stranded (last: $seen)"
  stop_holder
  ctl watch "$id" >"$sdir/watch.txt" 2>&1
  describe "$id"
  local end
  end=$(jget "$sdir/run.json" "d['state']")
  sdir=$(dirname "$sdir")
  local figures
  figures=$("$python" -c 'import json,sys; print(json.dumps({"stranded": sys.argv[1], "drained": sys.argv[2], "run_after_drain": sys.argv[3]}))' "$first" "$seen" "$end")
  [[ $end == RUN_STATE_SUCCEEDED ]] || failstage "the drained slot's run ended $end" "$figures"
  pass "stranded naming holder pid $first_holder, waited, went on; drained with drain_stranded_after_s" "$figures"
}

stage_script() {
  fake_gpus 1
  start_daemon
  cp "$root/tests/gpu/e2e_train.py" "$sdir/e2e_train.py"
  local figures id end
  for fault in CRASH_AT_STEP OOM_AT_STEP; do
    cat >"$sdir/$fault.toml" <<TOML
name = "e2e-script-${fault,,}"
[command]
argv = ["$python", "$sdir/e2e_train.py"]
cwd = "$sdir"
heartbeats = true
total_steps = 20
[command.env]
PYTHONPATH = "$pydir"
STEPS = "20"
$fault = "12"
TOML
    id=$(ctl submit "$sdir/$fault.toml") || failstage "submit of the $fault script failed"
    ctl watch "$id" >"$sdir/$fault.watch.txt" 2>&1
    describe "$id"
    cp "$sdir/run.json" "$sdir/$fault.run.json"
    end=$(jget "$sdir/run.json" "d['state']")
    [[ $end == RUN_STATE_SUCCEEDED ]] || failstage "the $fault script ended $end"
    [[ $(jget "$sdir/run.json" "len(d['attempts'])") == 2 ]] || failstage "the $fault script took $(jget "$sdir/run.json" "len(d['attempts'])") attempts, expected 2"
    [[ $(jget "$sdir/run.json" "int(d['attempts'][1]['resumed_from_step']) >= 10") == True ]] ||
      failstage "the $fault script's attempt 2 did not resume from its step-10 checkpoint"
  done
  local first_exit oom_class oom_code oom_restarts
  first_exit=$(jget "$sdir/CRASH_AT_STEP.run.json" "d['attempts'][0]['exit_class']")
  oom_class=$(jget "$sdir/OOM_AT_STEP.run.json" "d['attempts'][0]['exit_class']")
  oom_code=$(jget "$sdir/OOM_AT_STEP.run.json" "d['attempts'][0]['ranks'][0]['exit_code']")
  oom_restarts=$(jget "$sdir/OOM_AT_STEP.run.json" "d.get('oom_restarts', 0)")
  local simulated=false
  grep -q simulated "$state/runs/"*oom*/attempts/1/rank-0.log 2>/dev/null && simulated=true
  figures=$("$python" -c 'import json,sys; print(json.dumps({"crash_exit_class": sys.argv[1], "oom_exit_class": sys.argv[2], "oom_exit_code": int(sys.argv[3]), "oom_restarts": int(sys.argv[4]), "oom_simulated": sys.argv[5] == "true"}))' "$first_exit" "$oom_class" "$oom_code" "$oom_restarts" "$simulated")
  [[ $oom_code == 75 && $oom_class == EXIT_CLASS_OOM && $oom_restarts -ge 1 ]] ||
    failstage "the out-of-memory error was not recorded as an OOM restart (exit $oom_code, $oom_class)" "$figures"
  pass "crashed once and resumed; torch.OutOfMemoryError -> exit 75, an OOM restart" "$figures"
}

stage_nccl() {
  local world backend
  if [[ $mode == gpu ]]; then
    world=$("$python" -c 'import torch; print(torch.cuda.device_count())')
    backend=nccl
  else
    world=2
    backend=gloo
    fake_gpus 2
  fi
  start_daemon
  WORLD=$world write_spec "$sdir/spec.toml" e2e-gang 6 "checkpoint_every_steps = 3" \
    "[distributed]" "backend = \"$backend\""
  local id
  id=$(ctl submit "$sdir/spec.toml") || failstage "submit failed"
  ctl watch "$id" >"$sdir/watch.txt" 2>&1
  describe "$id"
  local end formed
  end=$(jget "$sdir/run.json" "d['state']")
  formed=$(grep -h -o -m1 'gang .*' "$sdir"/state/runs/*/attempts/1/rank-0.log | head -1)
  local figures
  figures=$("$python" -c 'import json,sys; print(json.dumps({"world_size": int(sys.argv[1]), "backend": sys.argv[2], "state": sys.argv[3], "rank0_gang_line": sys.argv[4]}))' "$world" "$backend" "$end" "$formed")
  [[ $end == RUN_STATE_SUCCEEDED ]] || failstage "the $backend gang ended $end" "$figures"
  if [[ $mode == cpu ]]; then
    pass "a Gloo gang of 2 trained (NCCL needs CUDA devices: not run here)" "$figures"
  fi
  ((world >= 2)) || pass "world size 1 on a one-GPU machine: it trained, but a gang of one forms no NCCL group" "$figures"
  pass "an NCCL gang of $world trained" "$figures"
}

stage_determinism() {
  fake_gpus 1
  start_daemon
  local ids=() id
  for n in 1 2; do
    write_spec "$sdir/spec$n.toml" "e2e-det-$n" 10 "checkpoint_every_steps = 10" "deterministic = true" "seed = 7"
    id=$(ctl submit "$sdir/spec$n.toml") || failstage "submit failed"
    ctl watch "$id" >"$sdir/watch$n.txt" 2>&1 || failstage "deterministic run $n did not succeed"
    ids+=("$id")
  done
  local same=true differs=""
  for f in model.safetensors optimizer.safetensors; do
    if ! cmp -s "$state/runs/${ids[0]}/checkpoints/step-10/$f" "$state/runs/${ids[1]}/checkpoints/step-10/$f"; then
      same=false
      differs+="$f "
    fi
  done
  local figures
  figures=$("$python" -c 'import json,sys; print(json.dumps({"byte_identical": sys.argv[1] == "true", "differs": sys.argv[2].split()}))' "$same" "$differs")
  [[ $same == true ]] || failstage "the checkpoints differ: $differs" "$figures"
  pass "two deterministic runs: byte-identical checkpoints at step 10" "$figures"
}

# ---- one stage (the script calls itself under a deadline) ---------------------
if [[ -n $stage_only ]]; then
  sdir="$logs/$stage_only"
  mkdir -p "$sdir"
  trap stop_all EXIT
  "stage_$stage_only"
  failstage "the stage returned without a verdict"
fi

# ---- the run ------------------------------------------------------------------
if [[ $mode == cpu ]]; then
  : "${python:=/opt/trainsup/venv/bin/python3}"
  if [[ -z $bundle ]]; then
    # This tree's build, bundled now: an older bundle would test old code.
    bundle="$root/build/e2e-bundle/trainsup"
    say "bundling $root/build into $bundle"
    bash "$root/deploy/bundle.sh" --build "$root/build" --out "$bundle" >"$root/build/e2e-bundle.log" 2>&1 ||
      { say "deploy/bundle.sh failed (log: $root/build/e2e-bundle.log)"; exit 1; }
  fi
  deadline=${DEADLINE:-1500}
else
  : "${python:=python3}"
  : "${bundle:=$root/.gpu/trainsup.tar.xz}"
  deadline=${DEADLINE:-470}
fi
: "${logs:=${OUT:-$root/build/e2e}}"
: "${data:=$root/data/samples/urban.las}"
start=$(date +%s)
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
[[ -f $data ]] || { say "no scan at $data (deploy/fetch-sample-data.sh; carry data/samples)"; exit 64; }
if [[ $bundle == *.tar.xz ]]; then
  [[ -f $bundle ]] || { say "no bundle at $bundle (tests/gpu/prepare-e2e.sh makes it)"; exit 64; }
  mkdir -p "$logs/bundle"
  tar -C "$logs/bundle" -xJf "$bundle"
  bundle=$(ls -d "$logs"/bundle/*/ | head -1)
  bundle=${bundle%/}
fi
[[ -x $bundle/bin/trainsupd ]] || { say "$bundle is not a bundle (no bin/trainsupd)"; exit 64; }
bin="$bundle/bin"
pydir="$bundle/python"
python=$(command -v "$python") || { say "no Python '$python'"; exit 64; }
libs=$("$bin/torch-libs" "$python" 2>"$logs/torch-libs.log") || { say "torch-libs failed (log: $logs/torch-libs.log)"; exit 1; }
# A machine without xxhash for Python: the wheels prepare-e2e.sh carried.
if ! "$python" -c 'import xxhash' 2>/dev/null && [[ -d $root/.gpu/wheels ]]; then
  "$python" -m pip install --quiet --no-index --find-links "$root/.gpu/wheels" --target "$logs/pylib" xxhash >&2 &&
    pydir="$pydir:$logs/pylib"
fi
export E2E_MODE=$mode E2E_BUNDLE=$bundle E2E_LOGS=$logs E2E_PYTHON=$python E2E_DATA=$data
export bin pydir libs python data logs mode
say "mode $mode, bundle $bundle, python $python ($("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)), deadline ${deadline} s"

caps=(nvml:30 killed:120 oom_split:100 stranded:90 script:90 nccl:60 determinism:80)
# --cpu-only: oom_split trains 9 steps of 4 large synthetic scenes on the
# CPU. On a 2-core AMD EPYC Zen 4 that took 183 s alone, and over 300 s
# beside package.worker_root, which ctest -j2 runs at the same time: 600.
[[ $mode == cpu ]] && caps=(nvml:60 killed:400 oom_split:600 stranded:300 script:200 nccl:300 determinism:300)
failed=0
for entry in "${caps[@]}"; do
  name=${entry%%:*} cap=${entry#*:}
  left=$((deadline - ($(date +%s) - start) - 5))
  mkdir -p "$logs/$name"
  if ((left < 15)); then
    E2E_MODE=$mode sdir="$logs/$name" stage_only=$name result skipped "no time left of the ${deadline} s deadline"
    continue
  fi
  limit=$((cap < left ? cap : left))
  t0=$(date +%s)
  timeout -k 10 "$limit" "$self" --stage "$name" >"$logs/$name/stage.log" 2>&1
  rc=$?
  if [[ ! -f $logs/$name/result.json ]] || ((rc == 124 || rc == 137)); then
    sdir="$logs/$name" stage_only=$name result failed "no verdict within ${limit} s (exit $rc; log $logs/$name/stage.log)"
  fi
  ((rc != 0)) && failed=1
  say "$name: $(jget "$logs/$name/result.json" "d['status'] + ': ' + d['reason']") ($(($(date +%s) - t0)) s)"
done

commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
"$python" - "$logs" "$mode" "$(($(date +%s) - start))" "$commit" "$(uname -n)" "${caps[@]%%:*}" <<'PY'
import json, os, sys
logs, mode, seconds, commit, host, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6:]
out = {"mode": mode, "seconds": seconds, "commit": commit, "host": host, "stages": []}
for n in names:
    try:
        out["stages"].append(json.load(open(os.path.join(logs, n, "result.json"))))
    except Exception as e:
        out["stages"].append({"stage": n, "status": "failed", "reason": f"no result: {e}"})
out["ok"] = all(s["status"] != "failed" for s in out["stages"])
json.dump(out, open(os.path.join(logs, "summary.json"), "w"), indent=1)
print(json.dumps(out, indent=1))
PY
exit $failed
