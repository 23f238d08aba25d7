"""A training script with the installed trainsup client and no torch, for
the package tests: it "trains" a number with plain Python, checkpoints it
through trainsup.checkpoint() every 5 steps, crashes once on its first
attempt after step 12, and resumes from the checkpoint the daemon verified.

Prints "resumed from step N" and "done: weight W after S steps"."""
import json
import os
import sys
import time

import trainsup

STEPS = 20
attempt = int(os.environ.get("TRAINSUP_ATTEMPT", "1"))
print("trainsup client %s from %s" % (trainsup.__version__, trainsup.__file__), flush=True)

weight, start = 0.0, 1
if trainsup.resume_path():
    with open(os.path.join(trainsup.resume_path(), "state.json")) as f:
        state = json.load(f)
    weight, start = state["weight"], state["step"] + 1
    print("resumed from step %d" % state["step"], flush=True)

for step in range(start, STEPS + 1):
    weight += 0.5 ** step
    time.sleep(0.05)
    trainsup.progress(step, loss=1.0 - weight, total_steps=STEPS)
    if step % 5 == 0:
        with trainsup.checkpoint(step) as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step, "weight": weight}, f)
    if step == 12 and attempt == 1:
        print("crashing on purpose after step 12", flush=True)
        os._exit(3)
print("done: weight %.6f after %d steps" % (weight, STEPS), flush=True)
sys.exit(0)
