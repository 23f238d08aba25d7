"""An existing DistributedDataParallel script, unchanged for trainsup: the
process group from the environment torchrun sets (env://, Gloo), each rank
its shard of a synthetic batch, progress and rank 0's checkpoints through
the trainsup client, and resume from the checkpoint the daemon names.
"""
import os
import sys

import torch
import torch.distributed as dist

import trainsup

STEPS = int(os.environ.get("STEPS", "40"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "5"))


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = 0
    state = trainsup.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank}: resumed from step {start}", flush=True)
    for step in range(start + 1, STEPS + 1):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 8, generator=g)
        y = (x[:, 0] > 0).long()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        trainsup.progress(step, loss=loss.item(), total_steps=STEPS)
        print(f"rank {rank}: step {step}/{STEPS} loss {loss.item():.6f}", flush=True)
        if (step % CHECKPOINT_EVERY == 0 or step == STEPS) and rank == 0:
            trainsup.save_checkpoint(step, {"model": model.module.state_dict(),
                                            "optimizer": opt.state_dict(), "step": step})
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
