#!/usr/bin/env python3
"""Checks the sample Grafana dashboard: valid JSON, unique panel ids, and
queries that use only metrics supervisor/metrics.h exports, covering the
ones an operator needs (runs, restarts, heartbeat age, step rate, memory,
slot health, checkpoint age, elastic gangs' size and resizes, and the
learning row: loss, learning rate, validation mIoU, out-of-memory splits,
retries and their wasted seconds, steps by outcome).
Usage: check_dashboard.py DASHBOARD_JSON METRICS_H
"""
import json
import re
import sys

REQUIRED = [
    "trainsup_runs",
    "trainsup_restarts_total",
    "trainsup_worker_heartbeat_age_seconds",
    "trainsup_worker_step_rate",
    "trainsup_worker_memory_bytes",
    "trainsup_slot_healthy",
    "trainsup_checkpoint_age_seconds",
    "trainsup_run_world_size",
    "trainsup_resizes_total",
    "trainsup_worker_loss",
    "trainsup_worker_learning_rate",
    "trainsup_run_val_miou",
    "trainsup_worker_oom_splits",
    "trainsup_worker_oom_retries",
    "trainsup_worker_oom_wasted_seconds",
    "trainsup_run_steps",
]


def panels_of(container):
    for panel in container.get("panels", []):
        yield panel
        yield from panels_of(panel)


def main():
    try:
        dashboard = json.load(open(sys.argv[1]))
    except json.JSONDecodeError as e:
        print("dashboard is not valid JSON: %s" % e)
        return 1
    # The metric list at the top of metrics.h: "//   trainsup_name{labels}  type".
    exported = set(re.findall(r"^//\s+(trainsup_\w+)", open(sys.argv[2]).read(), re.M))
    if not exported:
        print("no metric names found in %s" % sys.argv[2])
        return 1

    errors = []
    ids = [p.get("id") for p in panels_of(dashboard)]
    if len(ids) != len(set(ids)):
        errors.append("panel ids are not unique: %s" % ids)
    used = set()
    for panel in panels_of(dashboard):
        for target in panel.get("targets", []):
            for name in re.findall(r"\btrainsup_\w+", target.get("expr", "")):
                used.add(name)
                if name not in exported:
                    errors.append("panel '%s' queries %s, which metrics.h does not export"
                                  % (panel.get("title"), name))
    for name in REQUIRED:
        if name not in used:
            errors.append("no panel shows %s" % name)
    if errors:
        print("\n".join(errors))
        return 1
    print("dashboard ok: %d panels, %d metrics used" % (len(ids), len(used)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
