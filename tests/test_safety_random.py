"""Randomized: the safety nets never refuse a good run and never write a bad file (issue 36, "Must show").

Each seed draws a model with non-finite buffers by design (a causal mask, an ``inf`` buffer, a
sparse buffer), a hook with an ``inf`` sentinel, EMA or not, sync or async saves, an interval,
and a NaN injected at a random iteration (a NaN gradient under a finite loss, a NaN or a new inf
in a buffer, a NaN hook sentinel) or none. Properties, checked against an oracle written here
(not the check itself): every save of a finite training state succeeds (all of them, when
nothing is injected, plus rank-0-style saves after the run); no file holds a non-finite value
that was not there, the same, when the run started; the run stops at the first save after the
injection. The 2-process gloo part (DDP with rank-0-only saves, FSDP sharded saves with a NaN on
one rank only) runs in one torchrun launch, bounded: a hang fails it in seconds, not minutes.
"""
import json
import math
import os
import random
import sys

import pytest
import torch
import torch.distributed as torch_dist
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.checkpoint.format import load_checkpoint
from hookloop.errors import InvalidLossError
from hookloop.priority import Priority

sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'dist'))
import safety_worker as SW  # noqa: E402  (the 2-process part's worker; its EarlyStop is the hook with an inf sentinel)
from launch import ROOT, check_ok, torchrun  # noqa: E402
from safety_worker import EarlyStop  # noqa: E402

CAUSAL = torch.nn.Transformer.generate_square_subsequent_mask(4)
BUFFERS = {
    'mask': lambda: CAUSAL.clone(),
    'sentinel': lambda: torch.tensor([math.inf, 0.0, -math.inf]),
    'adjacency': lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([2.0, -3.0]), (2, 2)),
}


class Drawn(Regressor):
    def __init__(self, buffers):
        super().__init__()
        for name in buffers:
            self.register_buffer(name, BUFFERS[name]())


class Inject(Hook):
    """At iteration index ``at``: a NaN into a buffer / the hook sentinel (before the
    checkpoint hook acts), or a NaN gradient for that iteration's backward (finite loss)."""
    PRIORITY = Priority.HIGHEST

    def __init__(self, kind, at):
        self.kind, self.at = kind, at

    def before_run(self, trainer):
        if self.kind == 'grad':
            weight = trainer.model.net[0].weight
            weight.register_hook(lambda grad: grad * math.nan if trainer.iter == self.at else grad)

    def after_train_iter(self, trainer):
        if trainer.iter != self.at:
            return
        model = trainer.model
        with torch.no_grad():
            if self.kind == 'mask':
                model.mask[1, 0] = -math.inf  # a new -inf where the mask held 0
            elif self.kind == 'sentinel-buffer':
                model.sentinel[0] = math.nan
            elif self.kind == 'sparse':
                model.adjacency._values()[0] = math.nan
            elif self.kind == 'hook':
                next(h for h in trainer.hooks if isinstance(h, EarlyStop)).best = math.nan


def draw(seed):
    rng = random.Random(seed)
    buffers = [name for name in BUFFERS if rng.random() < 0.6]
    kinds = ['grad', 'hook'] + [{'mask': 'mask', 'sentinel': 'sentinel-buffer', 'adjacency': 'sparse'}[b]
                                for b in buffers]
    max_iters = rng.randint(3, 7)
    inject = None if rng.random() < 0.35 else (rng.choice(kinds), rng.randrange(max_iters))
    return dict(buffers=buffers, ema=rng.random() < 0.5, async_save=rng.random() < 0.5,
                interval=rng.randint(1, 3), max_iters=max_iters, inject=inject)


def allowed_non_finite(key, value, start):
    """The oracle: ``value`` (at ``key`` of the model's state, or a copy) is finite, or non-finite
    only where the buffer ``key`` held the very same non-finite numbers when the run started."""
    dense = value.to_dense() if value.is_sparse else value
    bad = ~torch.isfinite(dense)
    if not bad.any():
        return True
    if key not in start:
        return False
    initial = start[key].to_dense() if start[key].is_sparse else start[key]
    return dense.shape == initial.shape and bool(torch.equal(torch.where(bad, dense, 0), torch.where(bad, initial, 0))
                                                 ) and bool((bad <= ~torch.isfinite(initial)).all())


def assert_no_new_non_finite(checkpoint, start):
    for section in ('state_dict', 'ema_state_dict'):
        for key, value in checkpoint.get(section, {}).items():
            assert allowed_non_finite(key, value, start), (section, key)
    for hook, state in checkpoint.get('hooks', {}).items():
        for key, value in state.items() if isinstance(state, dict) else ():
            if isinstance(value, float):
                assert math.isfinite(value) or (hook == 'EarlyStop' and value == math.inf), (hook, key)
    for state in checkpoint.get('optimizer', {}).get('state', {}).values():
        for value in state.values():
            assert torch.isfinite(value).all()


@pytest.mark.parametrize('seed', range(12))
def test_random_runs_save_every_good_state_and_no_bad_one(tmp_path, seed):
    case = draw(seed)
    torch.manual_seed(seed)
    model = Drawn(case['buffers'])
    start = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = [EarlyStop()] + ([Inject(*case['inject'])] if case['inject'] else [])
    if case['ema']:
        hooks.append(dict(type='EMAHook', momentum=0.5, warm_up=1))
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(regression_data(), 8), max_iters=case['max_iters'],
                      work_dir=str(tmp_path), seed=seed, device='cpu', log_config=dict(interval=100),
                      custom_hooks=hooks, checkpoint_config=dict(interval=case['interval'], by_epoch=False,
                                                                 async_save=case['async_save']))
    save_points = {n for n in range(1, case['max_iters'] + 1) if n % case['interval'] == 0 or n == case['max_iters']}
    if case['inject'] is None:
        trainer.train()
        expected = save_points
        trainer.save_checkpoint('after_run.pth', update_last=False)  # a save after train(), as rank 0 makes it
        from hookloop.compat.mmcv import save_checkpoint
        save_checkpoint(trainer.model, str(tmp_path / 'mmcv.pth'))
    else:
        kind, at = case['inject']
        with pytest.raises(InvalidLossError):
            trainer.train()
        expected = {n for n in save_points if n <= at}  # every save before the injected NaN was made
    trainer.close()
    written = sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth'))
    extra = ['after_run.pth', 'mmcv.pth'] if case['inject'] is None else []
    assert written == sorted([f'iter_{n}.pth' for n in expected] + extra), case
    for name in written:
        assert_no_new_non_finite(load_checkpoint(str(tmp_path / name)), start)



GLOO_SEEDS = (0, 1, 2, 3)


@pytest.mark.skipif(not (torch_dist.is_available() and torch_dist.is_gloo_available()),
                    reason='torch.distributed with gloo is not available')
def test_two_rank_saves_rank0_only_and_sharded_never_hang_nor_write_a_bad_file(tmp_path):
    program = [os.path.join(ROOT, 'tests', 'dist', 'safety_worker.py'), str(tmp_path), *map(str, GLOO_SEEDS)]
    proc, _ = torchrun(None, tmp_path, program=program, timeout=240)  # a hang fails here, not after minutes
    check_ok(proc)
    results = [json.load(open(tmp_path / f'result_rank{r}.json')) for r in (0, 1)]
    assert results[0].keys() == results[1].keys()
    start = {k: v for k, v in SW.Masked().state_dict().items()}
    for run, error in results[0].items():
        strategy, seed = run.split('_')
        case, work = SW.draw(int(seed)), tmp_path / run
        save_points = {n for n in range(1, case['max_iters'] + 1)
                       if n % case['interval'] == 0 or n == case['max_iters']}
        if case['at'] is None:  # a finite run: every save made, by every rank's reckoning
            assert error is None and results[1][run] is None, run
            expected = save_points
        else:  # stopped at the first save after the NaN (by the check, or the NaN guard's look before it)
            refused = f'iter_{min(n for n in save_points if n > case["at"])}.pth'
            assert all(refused in e or 'non-finite loss' in e for e in (error, results[1][run])), (run, error)
            if strategy == 'fsdp' and refused == f'iter_{case["at"] + 1}.pth':  # the NaN came right before
                # that save, with every loss finite: the ranks agreed, rank 1 names its shard, rank 0 "another rank"
                assert 'body.weight' in results[1][run] and 'the state of another rank' in error, run
            expected = {n for n in save_points if n <= case['at']}
        names = {f'iter_{n}.pth' for n in expected}
        if strategy == 'ddp' and case['at'] is None:
            names |= {'rank0_only.pth', 'master_only.pth'}
        assert {n for n in os.listdir(work) if n.endswith('.pth')} == names, run
        for name in sorted(names):
            path = work / name
            if path.is_dir():  # a sharded checkpoint: complete, its shards verified by the load
                assert (path / 'hookloop.pth').is_file(), (run, name)
                continue
            assert_no_new_non_finite(load_checkpoint(str(path)), start)
