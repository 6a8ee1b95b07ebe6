"""The per-rank program of the randomized 2-process safety test (``tests/test_safety_random.py``).

``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/dist/safety_worker.py OUT SEED...``

For each seed, one DDP run of a model with non-finite buffers by design (a causal mask, an
``inf`` buffer) and a hook with an ``inf`` sentinel, a NaN gradient injected at a drawn
iteration or none, checkpoints at a drawn interval; after a finished run, saves that **rank 0
makes alone** (``trainer.save_checkpoint`` and MMCV's ``save_checkpoint`` under ``@master_only``)
while rank 1 goes straight on to the next run. Then (FSDP2 available) one sharded run per seed
with a NaN put into **rank 1's shard only** at a drawn iteration. The worker makes the process
group itself (the trainers use it and leave it open after a refused save), with a short timeout,
so a collective one rank makes alone fails in seconds instead of waiting. Each rank writes
``OUT/result_rank<r>.json``: per run, the error it stopped with (None when it finished).
"""
import datetime
import json
import math
import os
import random
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..')))

from hookloop import Trainer  # noqa: E402
from hookloop.compat.mmcv import master_only, save_checkpoint  # noqa: E402
from hookloop.errors import InvalidLossError  # noqa: E402
from hookloop.hooks.base import Hook  # noqa: E402
from hookloop.priority import Priority  # noqa: E402

CAUSAL = nn.Transformer.generate_square_subsequent_mask(4)
DIST_TIMEOUT = 20  # seconds: a lone collective fails well within the test's launch timeout


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(6, 8), nn.Linear(8, 3)
        self.register_buffer('mask', CAUSAL.clone())
        self.register_buffer('sentinel', torch.tensor([math.inf, -math.inf]))

    def forward(self, x, label):
        return {'loss': nn.functional.cross_entropy(self.head(torch.tanh(self.body(x))), label)}


class EarlyStop(Hook):
    def __init__(self):
        self.best = math.inf

    def state_dict(self):
        return {'best': self.best}

    def load_state_dict(self, state):
        self.best = state['best']


class NaNGradient(Hook):
    """A NaN gradient (finite loss) in iteration index ``at``, on every rank (DDP averages it)."""

    def __init__(self, at):
        self.at = at

    def before_run(self, trainer):
        trainer.model.body.weight.register_hook(lambda g: g * math.nan if trainer.iter == self.at else g)


class NaNInRankOneShard(Hook):
    """At iteration index ``at`` (before the checkpoint hook acts) a NaN in rank 1's shard only."""
    PRIORITY = Priority.HIGHEST

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter == self.at and trainer.rank == 1:
            with torch.no_grad():
                trainer.model.body.weight.to_local().view(-1)[0] = math.nan


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=generator)
    return TensorDataset(x, (x @ torch.randn(6, 3, generator=generator)).argmax(dim=1))


def draw(seed):
    rng = random.Random(seed)
    max_iters = rng.randint(3, 6)
    return dict(max_iters=max_iters, interval=rng.randint(1, 3),
                at=None if rng.random() < 0.4 else rng.randrange(max_iters))


def run(work_dir, seed, strategy, inject):
    case = draw(seed)
    torch.manual_seed(seed)
    hooks = [EarlyStop()] + ([inject(case['at'])] if case['at'] is not None else [])
    trainer = Trainer(Masked(), optimizer=dict(type='SGD', lr=0.1, momentum=0.9),
                      train_dataloader=DataLoader(data(), batch_size=4, shuffle=True), max_iters=case['max_iters'],
                      work_dir=work_dir, seed=seed, device='cpu', strategy=strategy,
                      custom_hooks=hooks, log_config=dict(interval=100),
                      checkpoint_config=dict(interval=case['interval'], by_epoch=False))
    error = None
    try:
        trainer.train()
    except InvalidLossError as exc:
        error = str(exc)
    if error is None and strategy == 'ddp' and trainer.rank == 0:  # saves rank 0 makes alone
        trainer.save_checkpoint('rank0_only.pth', update_last=False)
    if error is None and strategy == 'ddp':
        master_only(save_checkpoint)(trainer.model, os.path.join(work_dir, 'master_only.pth'))
    trainer.close()
    return error


def main():
    out, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
    torch.distributed.init_process_group('gloo', timeout=datetime.timedelta(seconds=DIST_TIMEOUT))
    rank = torch.distributed.get_rank()
    results = {}
    for seed in seeds:
        results[f'ddp_{seed}'] = run(os.path.join(out, f'ddp_{seed}'), seed, 'ddp', NaNGradient)
    from hookloop.dist.fsdp import fsdp2_available
    if fsdp2_available():
        for seed in seeds:
            results[f'fsdp_{seed}'] = run(os.path.join(out, f'fsdp_{seed}'), seed, 'fsdp', NaNInRankOneShard)
    with open(os.path.join(out, f'result_rank{rank}.json'), 'w') as f:
        json.dump(results, f)
    torch.distributed.destroy_process_group()


if __name__ == '__main__':
    main()
