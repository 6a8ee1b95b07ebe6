"""Golden test: the terminal/``.log`` lines and the JSON-lines records of a few fixed runs are
byte-identical to the ones the logging code wrote before it was made faster (issue 26).

The expectations in ``tests/golden/`` were produced by the code *before* that change. Times are made
deterministic by a clock injected in place of ``time.perf_counter`` that depends only on the
trainer's position (not on how often it is read), so ``time``, ``data_time`` and the ETA are fixed;
only the ``asctime`` prefix of each line (from ``time.time``), the work dir's path and the run's
timestamp (in the log files' names) are masked.

The model's arithmetic is not: another CPU (another SIMD width, another BLAS kernel) rounds the
losses differently in the last float32 bits. So the text between numbers must be identical, every
number must keep its form (an int stays an int; a fixed-point number keeps its count of decimals in
the terminal and ``.log`` lines, where the format string sets it) and agree with the golden one to
a relative 1e-5 or one unit of its last printed digit; on the machine that wrote the goldens the output is byte-identical.

Regenerate (only when a change of the output is intended): ``HOOKLOOP_REGEN_GOLDEN=1 pytest tests/test_log_golden.py``.
"""
import glob
import logging
import os
import re
import time

import pytest
import torch

from hookloop import Hook
from log_utils import make_trainer, run

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')
ASCTIME = re.compile(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - ', re.M)


class ExtraMeters(Hook):
    """Meters of every kind a logger formats: a device tensor, a tiny float, an int."""

    def after_train_iter(self, trainer):
        trainer.meters.update('acc', torch.tensor(0.5 + 0.01 * (trainer.iter % 7)))
        trainer.meters.update('tiny', 1e-5 * (1 + trainer.iter % 3))
        trainer.meters.update('count', trainer.iter % 4)


class DtypeMeters(Hook):
    """Tensor meters of other dtypes and shapes (the summary turns them into float32 first)."""

    def after_train_iter(self, trainer):
        trainer.meters.update('f64', torch.tensor(1 / 3 + trainer.iter, dtype=torch.float64))
        trainer.meters.update('i64', torch.tensor(trainer.iter * 7))
        trainer.meters.update('bf16', torch.tensor(0.1 * trainer.iter, dtype=torch.bfloat16))
        trainer.meters.update('shaped', torch.tensor([2.5 + trainer.iter]))


class Capture(logging.Handler):
    """A user's handler on the run's logger: it must keep getting every record."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(f'{record.levelname}:{record.getMessage()}')


SCENARIOS = {
    # the default logger (TextLoggerHook, by epoch, ignore_last) with validation and checkpoints
    'default': dict(hooks=[dict(type='TextLoggerHook')], interval=3, val=True,
                    checkpoint_config=dict(interval=1)),
    # global iterations, the last partial interval logged, experiment name, clipping, a schedule
    'iters': dict(hooks=[dict(type='TextLoggerHook', by_epoch=False, ignore_last=False, interval_exp_name=4)],
                  interval=4, optimizer_config=dict(grad_clip=dict(max_norm=1.0)),
                  lr_config=dict(policy='Step', step=[1])),
    # fp16 on the CPU (loss_scale), accumulation, extra meters of every type
    'fp16_accum': dict(hooks=[dict(type='TextLoggerHook')], interval=2,
                       optimizer_config=dict(precision='fp16', cumulative_iters=2), custom_hooks=[ExtraMeters()]),
    # tensor meters of several dtypes, by global iterations
    'dtypes': dict(hooks=[dict(type='TextLoggerHook', by_epoch=False)], interval=3, custom_hooks=[DtypeMeters()]),
    # a static loss scale (MMCV's Fp16OptimizerHook) and a logger interval of 1
    'fp16_static': dict(hooks=[dict(type='TextLoggerHook', interval=1)], interval=1, max_epochs=1,
                        optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=512.)),
}


def produce(name, tmp_path, monkeypatch, capsys):
    options = dict(SCENARIOS[name])
    work_dir = str(tmp_path / name)
    holder = {}

    def clock():  # a function of the position only: the same values however often it is read
        trainer = holder.get('trainer')
        if trainer is None:
            return 0.0
        return trainer.iter * 0.125 + trainer.epoch * 0.5

    monkeypatch.setattr(time, 'perf_counter', clock)
    trainer = make_trainer(work_dir, options.pop('hooks'), interval=options.pop('interval'),
                           max_epochs=options.pop('max_epochs', 2), val=options.pop('val', False), **options)
    holder['trainer'] = trainer
    capture = Capture()
    trainer.logger.addHandler(capture)
    capsys.readouterr()
    run(trainer)
    monkeypatch.undo()
    stdout = ASCTIME.sub('<asctime> - ', capsys.readouterr().out)
    (log_path,) = glob.glob(os.path.join(work_dir, '*.log'))
    (json_path,) = glob.glob(os.path.join(work_dir, '*.log.json'))
    with open(log_path, encoding='utf-8') as f:
        text = ASCTIME.sub('<asctime> - ', f.read())
    with open(json_path, encoding='utf-8') as f:
        records = f.read()
    handler = '\n'.join(capture.lines) + '\n'
    def mask(s):
        return s.replace(os.path.abspath(work_dir), '<work_dir>').replace(trainer.timestamp, '<timestamp>')

    return {'log': mask(text), 'json': mask(records), 'handler': mask(handler), 'stdout': mask(stdout)}


NUMBER = re.compile(r'-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')


def differences(text, expected, kind):
    """Where ``text`` differs from ``expected`` beyond another machine's float rounding (see above)."""
    if NUMBER.split(text) != NUMBER.split(expected):
        return 'the text between the numbers differs'
    for got, want in zip(NUMBER.findall(text), NUMBER.findall(expected)):
        if got == want:
            continue
        if ('.' in got) != ('.' in want) or ('e' in got.lower()) != ('e' in want.lower()):
            return f'{got} is not written like {want}'
        if '.' not in want and 'e' not in want.lower():
            return f'{got} != {want}'  # counters and ints: exact
        if kind != 'json' and len(got.partition('.')[2]) != len(want.partition('.')[2]):
            return f'{got} has not the decimals of {want}'
        mantissa, _, exponent = want.lower().partition('e')
        last_digit = 10.0 ** (int(exponent or 0) - len(mantissa.partition('.')[2]))  # a rounding flips it
        if abs(float(got) - float(want)) > max(1e-5 * abs(float(want)), 1.01 * last_digit):
            return f'{got} != {want}'
    return None


def test_differences_tell_format_from_rounding():
    assert differences('loss: 1.2346, x 3', 'loss: 1.2345, x 3', 'log') is None
    assert differences('"loss": 28.900381724039715', '"loss": 28.90037663777669', 'json') is None
    assert differences('loss: 1.23460', 'loss: 1.2346', 'log') is not None  # a decimal more
    assert differences('loss: 1.2346', 'loss= 1.2346', 'log') is not None
    assert differences('iter 10', 'iter 9', 'log') is not None
    assert differences('lr 5e-02', 'lr 0.05', 'log') is not None
    assert differences('loss: 1.3000', 'loss: 1.2000', 'log') is not None


@pytest.mark.parametrize('name', sorted(SCENARIOS))
def test_log_output_matches_golden(name, tmp_path, monkeypatch, capsys):
    produced = produce(name, tmp_path, monkeypatch, capsys)
    for kind, text in produced.items():
        path = os.path.join(GOLDEN, f'{name}.{kind}.txt')
        if os.environ.get('HOOKLOOP_REGEN_GOLDEN'):
            with open(path, 'w', encoding='utf-8') as f:
                f.write(text)
            continue
        with open(path, encoding='utf-8') as f:
            expected = f.read()
        problem = differences(text, expected, kind)
        assert problem is None, f'{name}: the {kind} output differs from {path}: {problem}'
