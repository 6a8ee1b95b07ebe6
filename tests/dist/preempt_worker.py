"""Per-rank program of the torchrun preemption test: trains (slowly) until SIGTERM.

``torchrun --nproc-per-node 2 tests/dist/preempt_worker.py OUT``. The run has a checkpoint
hook and no PreemptionHook: preemption is the default. Each rank writes
``OUT/started_rank<r>`` once training is under way and, on its way out,
``OUT/rank<r>.json`` with the iteration it stopped after and the status it exits with.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hookloop import Trainer  # noqa: E402
from hookloop.hooks.base import Hook  # noqa: E402
from hookloop.priority import Priority  # noqa: E402
from worker import LR, MOMENTUM, SEED, loader, make_model, train_set  # noqa: E402


class Slow(Hook):
    """About 20 iterations a second, rank 1 slower than rank 0 (it catches up in DDP's
    all-reduce), and a file once three iterations are done."""

    def __init__(self, out):
        self.out = out

    def before_train_iter(self, trainer):
        time.sleep(0.03 + 0.02 * trainer.rank)
        if trainer.iter == 3:
            open(os.path.join(self.out, f'started_rank{trainer.rank}'), 'w').close()


class Record(Hook):
    PRIORITY = Priority.LOWEST

    def __init__(self, out):
        self.out = out

    def after_run(self, trainer):
        self.iter, self.stop_reason = trainer.iter, trainer.stop_reason


def main(out):
    record = Record(out)
    trainer = Trainer(model=make_model(), optimizer=dict(type='SGD', lr=LR, momentum=MOMENTUM),
                      train_dataloader=loader(train_set(), 4, True), max_epochs=10000, seed=SEED, device='cpu',
                      work_dir=os.path.join(out, 'work'), log_config=dict(interval=1000),
                      checkpoint_config=dict(interval=100000, by_epoch=False), custom_hooks=[Slow(out), record])
    status = 1
    try:
        trainer.train()
        status = 0
    finally:
        trainer.close()
        with open(os.path.join(out, f'rank{trainer.rank}.json'), 'w') as f:
            json.dump({'iter': getattr(record, 'iter', None), 'stop_reason': getattr(record, 'stop_reason', None),
                       'status': status, 'time': time.time()}, f)
    sys.exit(status)


if __name__ == '__main__':
    main(sys.argv[1])
