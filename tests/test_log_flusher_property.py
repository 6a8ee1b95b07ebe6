"""A property test of the logs where they meet the rest (issues 26 and 36): random runs with
random log intervals (by epoch or not, ``ignore_last`` or not), validation, sync or async
checkpoints, TensorBoard or DVCLive beside the text log, a failure at a random iteration and a
resume of the failed run, a hook's own ``logger.info`` lines at random iterations, a user's
handler on the run's logger or not. The trackers' records either wait for the flush points (a
period of an hour) or go at nearly every event (2 ms), and:

* at every iteration and before every checkpoint is built, the JSON log on disk holds every
  record logged so far (the lines are written at their events);
* after every run (finished or failed), it holds exactly the records logged, in order;
* the ``.log`` files hold the train and val lines and the hook's lines in the order they were
  logged, and so does a user's handler, which has every record by the time the next line is logged;
* TensorBoard's event file and DVCLive's series have the same train steps, in order;
* no tracker's records are left registered with the flusher.
"""
import logging
import glob
import json
import os
import random

import pytest
import torch

from hookloop import Hook
from hookloop.hooks import TextLoggerHook
from hookloop.logging import flusher
from hookloop.logging.record_batch import RecordBatch
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


def kind(message):
    """What a logged message is: ('train',), ('val',), ('note', n), or None for the rest."""
    if message.startswith('note '):
        return ('note', int(message[5:]))
    if message.startswith(('Epoch(val)', 'Iter(val)')):
        return ('val',)
    if '\tlr: ' in message:
        return ('train',)
    return None


def log_file_kinds(work_dir):
    kinds = []
    for path in sorted(glob.glob(os.path.join(work_dir, '*.log'))):  # a resume writes a second log
        with open(path, encoding='utf-8') as f:
            kinds += [kind(line.rstrip('\n').split(' - INFO - ', 1)[-1]) for line in f]
    return [k for k in kinds if k is not None]


class UserHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.kinds = []

    def emit(self, record):
        if kind(record.getMessage()) is not None:
            self.kinds.append(kind(record.getMessage()))


class Probe(Hook):
    """Logs a line of its own at the iterations ``notes``; fails at ``fail_at`` (0-based
    iteration); at each checkpoint build compares the disk with what the text logger logged."""

    def __init__(self, work_dir, logged, fail_at, notes, sequence, user):
        self.work_dir, self.logged, self.fail_at, self.checked = work_dir, logged, fail_at, 0
        self.notes, self.sequence, self.user = notes, sequence, user

    def before_save_checkpoint(self, trainer, checkpoint):
        assert disk_records(self.work_dir) == self.logged
        self.checked += 1

    def before_train_iter(self, trainer):
        assert disk_records(self.work_dir) == self.logged  # every line at its event

    def after_train_iter(self, trainer):
        if trainer.iter in self.notes:
            if self.user is not None:  # a user's handler has every line at its event
                assert self.user.kinds == self.sequence[self.user.start:]
            self.sequence.append(('note', trainer.iter))
            trainer.logger.info('note %d', trainer.iter)
        if trainer.iter == self.fail_at:
            raise Boom(f'at {trainer.iter}')


def run_once(work_dir, case, logged, fail_at, resume, sequence):
    hooks = [dict(type='TextLoggerHook', by_epoch=case['by_epoch'], ignore_last=case['ignore_last'])]
    if case['tensorboard']:
        hooks.append(dict(type='TensorboardLoggerHook', by_epoch=case['by_epoch'], ignore_last=case['ignore_last']))
    if case['dvclive']:
        hooks.append(dict(type='DvcliveLoggerHook', by_epoch=case['by_epoch'], ignore_last=case['ignore_last']))
    extra = dict(evaluation=dict(interval=case['val_every'])) if case['val_every'] else {}
    trainer = make_trainer(work_dir, hooks, interval=case['interval'], max_epochs=case['epochs'],
                           val=bool(case['val_every']), auto_resume=resume,
                           checkpoint_config=dict(interval=case['ckpt_every'], by_epoch=False,
                                                  async_save=case['async_save']), **extra)
    user = None
    if case['user_handler']:
        user = UserHandler()
        user.start = len(sequence)  # (what this run logs comes after)
        trainer.logger.addHandler(user)
    probe = Probe(work_dir, logged, fail_at, case['notes'], sequence, user)
    trainer.register_hook(probe)
    try:
        trainer.train()
    except Boom:
        pass
    finally:
        trainer.close()
    if user is not None:
        assert user.kinds == sequence[user.start:], case
    return trainer, probe


@pytest.mark.parametrize('seed', range(CASES))
def test_logs_are_complete_at_every_event_and_flush_point(tmp_path, monkeypatch, seed, flush_every):
    rng = random.Random(seed)
    case = dict(interval=rng.choice([2, 3, 4, 5]), by_epoch=rng.random() < 0.5, ignore_last=rng.random() < 0.5,
                epochs=rng.choice([1, 2, 3]), val_every=rng.choice([0, 1]), ckpt_every=rng.choice([3, 4, 7]),
                async_save=rng.random() < 0.5, tensorboard=rng.random() < 0.3,
                flush_seconds=rng.choice([3600.0, 0.002]), user_handler=rng.random() < 0.5)
    if case['tensorboard']:
        pytest.importorskip('tensorboard')
    total = 10 * case['epochs']  # make_trainer: 10 iterations per epoch
    case['notes'] = set(rng.sample(range(total), rng.randrange(total // 2)))
    fail_at = rng.randrange(total) if rng.random() < 0.5 else None
    case['dvclive'] = fail_at is None and rng.random() < 0.3  # (a new Live would clear the failed run's files)
    if case['dvclive']:
        pytest.importorskip('dvclive')
        monkeypatch.chdir(tmp_path)  # dvclive works relative to the current directory
        monkeypatch.setenv('DVCLIVE_TEST', 'true')
    flush_every(case['flush_seconds'])
    logged, sequence = [], []
    original = TextLoggerHook.log

    def log(self, trainer, record):
        original(self, trainer, record)
        logged.append(json.loads(json.dumps(record, default=float)))  # as the JSON log holds it
        sequence.append((record['mode'],))

    monkeypatch.setattr(TextLoggerHook, 'log', log)
    torch.manual_seed(seed)
    runs = [run_once(tmp_path, case, logged, fail_at, resume=False, sequence=sequence)]
    if fail_at is not None:  # the failed run resumed from its last checkpoint: one more log file
        runs.append(run_once(tmp_path, case, logged, None, resume=True, sequence=sequence))
    assert disk_records(tmp_path) == logged, case
    assert log_file_kinds(tmp_path) == sequence, case
    assert not [t for t in flusher.registered() if isinstance(t, RecordBatch)], case
    if case['tensorboard']:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        steps = []
        for path in sorted(glob.glob(str(tmp_path / 'tf_logs' / 'events.out.tfevents.*'))):
            run_steps = [e.step for e in EventFileLoader(path).Load()
                         for v in e.summary.value if v.tag == 'train/loss']
            assert run_steps == sorted(run_steps), case
            steps += run_steps
        assert sorted(steps) == sorted(r['iter'] for r in logged if r['mode'] == 'train'), case
    if case['dvclive']:
        with open(tmp_path / 'dvclive' / 'plots' / 'metrics' / 'train' / 'loss.tsv') as f:
            header, *rows = f.read().split('\n')
        column = header.split('\t').index('step')
        assert [int(row.split('\t')[column]) for row in rows if row] == \
            [r['iter'] for r in logged if r['mode'] == 'train'], case
