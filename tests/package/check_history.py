"""Checks `trainctl describe -o json` of the package tests' script run: it
succeeded in two attempts, the first crashed with exit 3 after step 12, the
second resumed from the step-10 checkpoint. Usage: check_history.py FILE"""
import json
import sys

run = json.load(open(sys.argv[1]))
attempts = run["attempts"]
problems = []
if run["state"] != "RUN_STATE_SUCCEEDED":
    problems.append("state %s (%s)" % (run["state"], run.get("reason", "")))
if len(attempts) != 2:
    problems.append("%d attempts" % len(attempts))
else:
    if attempts[0]["ranks"][0]["exit_code"] != 3:
        problems.append("attempt 1 exited %s" % attempts[0]["ranks"][0]["exit_code"])
    if str(attempts[1]["resumed_from_step"]) != "10":
        problems.append("attempt 2 resumed from %s" % attempts[1]["resumed_from_step"])
if problems:
    sys.exit("check_history: " + "; ".join(problems))
print("check_history: one crash after step 12, resumed from step 10, succeeded")
