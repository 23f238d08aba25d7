"""A user's plain PyTorch script with the trainsup client's lines, for
tests/gpu/e2e.sh stage 5: a small MLP on a pure function of the step, on
CUDA when the machine has it, else the CPU.

Attempt 1 only: CRASH_AT_STEP aborts; OOM_AT_STEP runs out of memory
inside the client's exit_on_oom() (exit 75). On CUDA the out-of-memory
error is real: it asks the caching allocator for more than the device has.
On the CPU (e2e.sh --cpu-only) it raises torch.OutOfMemoryError itself,
and says so in its log.
"""
import os
import sys

import torch

import trainsup

STEPS = int(os.environ.get("STEPS", "30"))
ATTEMPT = int(os.environ.get("TRAINSUP_ATTEMPT", "1"))
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def fault(name):
    return int(os.environ.get(name, "-1")) if ATTEMPT == 1 else -1


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x.to(DEVICE), y.to(DEVICE)


def run_out_of_memory():
    if DEVICE.type == "cuda":
        free, total = torch.cuda.mem_get_info()
        print(f"asking for {2 * total >> 30} GiB of {total >> 30} GiB", flush=True)
        torch.empty(2 * total, dtype=torch.uint8, device=DEVICE)
    print("no CUDA device: raising torch.OutOfMemoryError (simulated)", flush=True)
    raise torch.OutOfMemoryError("out of memory (simulated on the CPU)")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"device {DEVICE}, torch {torch.__version__}", flush=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 2)).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = 0
    state = trainsup.load_checkpoint()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resumed from step {start}", flush=True)
    crash_at, oom_at = fault("CRASH_AT_STEP"), fault("OOM_AT_STEP")
    for step in range(start + 1, STEPS + 1):
        if step == crash_at:
            print(f"crashing at step {step}", flush=True)
            os.abort()
        x, y = batch(step)
        with trainsup.exit_on_oom():
            if step == oom_at:
                run_out_of_memory()
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        trainsup.progress(step, loss=loss.item(), total_steps=STEPS)
        if step % 5 == 0 or step == STEPS:
            trainsup.save_checkpoint(step, {"model": model.state_dict(),
                                            "optimizer": opt.state_dict(), "step": step})
    print(f"done at step {STEPS}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
