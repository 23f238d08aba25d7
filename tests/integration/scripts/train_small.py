"""A plain PyTorch training script, as a user has one, for the command-run
tests: a small MLP on synthetic data that is a pure function of the step,
SGD with momentum, checkpoints every CHECKPOINT_EVERY steps.

With USE_CLIENT=1 it uses the trainsup client (progress, checkpoints with
trainsup's manifest, resume, the out-of-memory helper); without, it is
supervised by its exit code only and keeps its own checkpoints.
Fault injection for the tests, on attempt 1 only: CRASH_AT_STEP (abort),
HANG_AT_STEP (stop progressing; the client's heartbeat thread goes on),
OOM_AT_STEP (raise an out-of-memory error through the helper).
At the end it writes final.pt (the weights) into its run directory.
"""
import os
import sys
import time

import torch

USE_CLIENT = os.environ.get("USE_CLIENT") == "1"
if USE_CLIENT:
    import trainsup

STEPS = int(os.environ.get("STEPS", "30"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "5"))
ATTEMPT = int(os.environ.get("TRAINSUP_ATTEMPT", "1"))
RUN_DIR = os.environ.get("TRAINSUP_RUN_DIR", ".")


def fault(name):
    value = int(os.environ.get(name, "-1"))
    return value if ATTEMPT == 1 else -1


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = 0
    if USE_CLIENT:
        state = trainsup.load_checkpoint()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            start = state["step"]
            print(f"resumed from step {start}", flush=True)
    crash_at, hang_at, oom_at = fault("CRASH_AT_STEP"), fault("HANG_AT_STEP"), fault("OOM_AT_STEP")
    for step in range(start + 1, STEPS + 1):
        if step == crash_at:
            print(f"crashing at step {step}", flush=True)
            os.abort()
        if step == hang_at:
            print(f"hanging at step {step}", flush=True)
            while True:
                time.sleep(1)
        x, y = batch(step)
        if USE_CLIENT:
            with trainsup.exit_on_oom():
                if step == oom_at:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
                loss = torch.nn.functional.cross_entropy(model(x), y)
        else:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}/{STEPS} loss {loss.item():.6f}", flush=True)
        if USE_CLIENT:
            trainsup.progress(step, loss=loss.item(), total_steps=STEPS)
            if step % CHECKPOINT_EVERY == 0 or step == STEPS:
                trainsup.save_checkpoint(
                    step, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step})
    torch.save(model.state_dict(), os.path.join(RUN_DIR, "final.pt"))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
