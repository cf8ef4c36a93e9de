"""A tiny Ray Train job: TorchTrainer with CPU workers over gloo, a small MLP trained for a few steps.

``python train_ray.py [--workers N] [--steps N] [--address ADDR]``: without ``--address`` the script starts a
local Ray cluster itself; with it, it joins one started before (``ray start --head``). Nothing here knows about
pitstop: whether the probe reaches the workers is up to Ray passing the environment on.
"""

from __future__ import annotations

import argparse

import ray
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model


def train_loop(config: dict[str, int]) -> None:
    torch.manual_seed(0)
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(config["steps"]):
        x = torch.randn(16, 32)
        loss = (model(x) - 1.0).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--address", default=None)
    args = parser.parse_args()
    if args.address:
        ray.init(address=args.address, _node_ip_address=args.address.rsplit(":", 1)[0])
    else:
        ray.init(num_cpus=args.workers + 1, include_dashboard=False)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": args.steps},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main()
