"""A property test of the buffered logs (issue 26) where they meet the rest: random runs with
random log intervals (by epoch or not, ``ignore_last`` or not), validation, sync or async
checkpoints, TensorBoard beside the text log, a failure at a random iteration and a resume of
the failed run. With the flusher's own timer out of the way (an hour), whatever is on disk comes
from the flush points, and:

* before every checkpoint is built, the JSON log on disk holds every record logged so far;
* after every run (finished or failed), it holds exactly the records logged, in order, and the
  ``.log`` one train line per train record;
* TensorBoard's event file has the same train steps, in order;
* no file of the run is left with the flusher.
"""
import glob
import json
import os
import random

import pytest
import torch

from hookloop import Hook
from hookloop.hooks import TextLoggerHook
from hookloop.logging import flusher
from log_utils import make_trainer

CASES = 24


class Boom(RuntimeError):
    pass


def disk_records(work_dir):
    records = []
    for path in sorted(glob.glob(os.path.join(work_dir, '*.log.json'))):  # a resume writes a second log
        with open(path, encoding='utf-8') as f:
            records += [json.loads(line) for line in f]
    return [r for r in records if r.get('mode') in ('train', 'val')]


def train_lines(work_dir):
    lines = []
    for path in sorted(glob.glob(os.path.join(work_dir, '*.log'))):
        with open(path, encoding='utf-8') as f:
            lines += [line for line in f if '\tlr: ' in line]
    return lines


class Probe(Hook):
    """Fails at ``fail_at`` (0-based iteration); at each checkpoint build compares the disk with
    what the text logger logged."""

    def __init__(self, work_dir, logged, fail_at):
        self.work_dir, self.logged, self.fail_at, self.checked = work_dir, logged, fail_at, 0

    def before_save_checkpoint(self, trainer, checkpoint):
        assert disk_records(self.work_dir) == self.logged
        self.checked += 1

    def after_train_iter(self, trainer):
        if trainer.iter == self.fail_at:
            raise Boom(f'at {trainer.iter}')


def run_once(work_dir, case, logged, fail_at, resume):
    hooks = [dict(type='TextLoggerHook', by_epoch=case['by_epoch'], ignore_last=case['ignore_last'])]
    if case['tensorboard']:
        hooks.append(dict(type='TensorboardLoggerHook', by_epoch=case['by_epoch'], ignore_last=case['ignore_last']))
    extra = dict(evaluation=dict(interval=case['val_every'])) if case['val_every'] else {}
    trainer = make_trainer(work_dir, hooks, interval=case['interval'], max_epochs=case['epochs'],
                           val=bool(case['val_every']), auto_resume=resume,
                           checkpoint_config=dict(interval=case['ckpt_every'], by_epoch=False,
                                                  async_save=case['async_save']), **extra)
    probe = Probe(work_dir, logged, fail_at)
    trainer.register_hook(probe)
    try:
        trainer.train()
    except Boom:
        pass
    finally:
        trainer.close()
    return trainer, probe


@pytest.mark.parametrize('seed', range(CASES))
def test_buffered_logs_are_complete_at_every_flush_point(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    case = dict(interval=rng.choice([2, 3, 4, 5]), by_epoch=rng.random() < 0.5, ignore_last=rng.random() < 0.5,
                epochs=rng.choice([1, 2, 3]), val_every=rng.choice([0, 1]), ckpt_every=rng.choice([3, 4, 7]),
                async_save=rng.random() < 0.5, tensorboard=rng.random() < 0.3)
    if case['tensorboard']:
        pytest.importorskip('tensorboard')
    total = 10 * case['epochs']  # make_trainer: 10 iterations per epoch
    fail_at = rng.randrange(total) if rng.random() < 0.5 else None
    monkeypatch.setattr(flusher, 'FLUSH_SECONDS', 3600.0)
    logged = []
    original = TextLoggerHook.log

    def log(self, trainer, record):
        original(self, trainer, record)
        logged.append(json.loads(json.dumps(record, default=float)))  # as the JSON log holds it

    monkeypatch.setattr(TextLoggerHook, 'log', log)
    torch.manual_seed(seed)
    runs = [run_once(tmp_path, case, logged, fail_at, resume=False)]
    if fail_at is not None:  # the failed run resumed from its last checkpoint: one more log file
        runs.append(run_once(tmp_path, case, logged, None, resume=True))
    assert disk_records(tmp_path) == logged, case
    assert len(train_lines(tmp_path)) == sum(r['mode'] == 'train' for r in logged), case
    names = [getattr(t, 'baseFilename', None) or getattr(t, 'name', None) or getattr(t, 'log_dir', '')
             for t in flusher._files]
    assert not [n for n in names if str(n).startswith(str(tmp_path))], case
    if case['tensorboard']:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        steps = []
        for path in sorted(glob.glob(str(tmp_path / 'tf_logs' / 'events.out.tfevents.*'))):
            run_steps = [e.step for e in EventFileLoader(path).Load()
                         for v in e.summary.value if v.tag == 'train/loss']
            assert run_steps == sorted(run_steps), case
            steps += run_steps
        assert sorted(steps) == sorted(r['iter'] for r in logged if r['mode'] == 'train'), case
