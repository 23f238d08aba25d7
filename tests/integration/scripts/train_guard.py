"""A training loop with the trainsup client's guard (docs/guard.md), for
the command-run rollback test: train_small.py's MLP, data a pure function
of the step, checkpoints every CHECKPOINT_EVERY steps.

On attempt 1, NAN_AT_STEP makes that step's loss NaN; the Guard (one bad
step diverges) then exits 79 naming it, and trainsupd resumes the next
attempt from the checkpoint before it, with TRAINSUP_SKIP_WINDOWS set.
EXTRA_SKIP ("6-8") gives a reference run the same window by hand. At the
end it writes final.pt (the weights) into its run directory.
"""
import os
import sys

import torch

import trainsup

STEPS = int(os.environ.get("STEPS", "16"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "2"))
ATTEMPT = int(os.environ.get("TRAINSUP_ATTEMPT", "1"))
RUN_DIR = os.environ.get("TRAINSUP_RUN_DIR", ".")
NAN_AT_STEP = int(os.environ.get("NAN_AT_STEP", "-1")) if ATTEMPT == 1 else -1


def extra_skip(step):
    for entry in filter(None, os.environ.get("EXTRA_SKIP", "").split(",")):
        first, last = (int(v) for v in entry.split("-"))
        if first <= step <= last:
            return True
    return False


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * trainsup.lr_factor(), momentum=0.9)
    guard = trainsup.Guard(max_bad_steps=1)
    start = 0
    state = trainsup.load_checkpoint()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resumed from step {start}; skip windows {trainsup.skip_windows()}", flush=True)
    for step in range(start + 1, STEPS + 1):
        x, y = batch(step)
        if trainsup.skip_step(step) or extra_skip(step):
            print(f"step {step} skipped", flush=True)
        else:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if step == NAN_AT_STEP:
                loss = loss * float("nan")
            opt.zero_grad()
            loss.backward()
            if guard.check(step, loss, model):
                opt.step()
            print(f"step {step}/{STEPS} loss {loss.item():.6f}", flush=True)
        trainsup.progress(step, total_steps=STEPS)
        if step % CHECKPOINT_EVERY == 0 or step == STEPS:
            trainsup.save_checkpoint(
                step, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step})
    torch.save(model.state_dict(), os.path.join(RUN_DIR, "final.pt"))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
