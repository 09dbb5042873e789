"""Run under torchrun (or alone): build the Trainer of a config and save this rank's weights, then stop.

    python -m torch.distributed.run --nproc_per_node 2 tests/parallel/table_worker.py CONFIG RUN_DIR OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from plelab.parallel.engine import from_environment
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer


def main() -> None:
    config, run_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    cfg = load_train_config(config)
    trainer = Trainer(cfg, run_dir, quiet=True, distribution=from_environment(cfg))
    table = getattr(trainer.distribution, "table", None)
    lo = table.lo if table is not None else 0
    state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    torch.save({"lo": lo, "state": state}, out / f"rank{trainer.world.rank}.pt")
    trainer.close()
    # Leave the group as a run does (model gone, then gc, barrier, destroy): a bare barrier + destroy with the
    # model's hooks still alive can hang one rank at exit.
    distribution = trainer.distribution
    del trainer, state
    distribution.close()


if __name__ == "__main__":
    main()
