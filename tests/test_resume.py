"""Exact resume: a run resumed from any checkpoint ends bitwise equal to one that never stopped."""
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import train_and_close
from hookloop import Trainer
from hookloop.data.resumable import ResumableBatchSampler, set_loader_epoch
from resume_helpers import AugmentedRegression, DropoutRegressor, assert_states_equal

ITERS_PER_EPOCH = 5  # 40 samples, batch 8


def make_trainer(work_dir, num_workers=0, max_epochs=3, seed=0, data=None, ema=True, optimizer_config=None,
                 lr_config=None, **kwargs):
    torch.manual_seed(1234)  # the same initial weights in every trainer
    model = DropoutRegressor()
    data = data if data is not None else AugmentedRegression(n=40)
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=num_workers)
    hooks = [dict(type='EMAHook', momentum=0.2, warm_up=3, priority='LOWEST')] if ema else []
    return Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                   max_epochs=max_epochs, work_dir=work_dir, seed=seed, device='cpu',
                   checkpoint_config=dict(interval=1, by_epoch=False), custom_hooks=hooks,
                   optimizer_config=optimizer_config, lr_config=lr_config, log_config=dict(interval=100),
                   **kwargs)


def flatten(prefix, value, out):
    """Tensors and numbers of a nested state, by dotted key (paths and other strings left out:
    they name the run's own work dir)."""
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(f'{prefix}.{key}', item, out)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            flatten(f'{prefix}.{index}', item, out)
    elif isinstance(value, torch.Tensor):
        out[prefix] = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = torch.tensor(value, dtype=torch.float64)
    return out


def final_state(trainer):
    """Model weights, optimizer state and every hook's state (EMA averages, scaler, ...) at the
    end of a run."""
    checkpoint = trainer.state_dict()
    state = flatten('model', checkpoint['state_dict'], {})
    flatten('optimizer', checkpoint['optimizer'], state)
    return flatten('hooks', checkpoint['hooks'], state)


def run(trainer):
    return final_state(train_and_close(trainer))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_resume_mid_epoch_and_epoch_boundary_with_workers_matches_uninterrupted_run(tmp_path):
    # Shuffling, dropout, augmentation in two data-loader workers, momentum SGD, EMA.
    reference = run(make_trainer(tmp_path / 'ref', num_workers=2))
    assert any(k.startswith('hooks.EMAHook.averages.') for k in reference)
    for completed in (7, 10):  # 7: in the middle of epoch 2; 10: the end of epoch 2
        resumed = make_trainer(tmp_path / f'resume_{completed}', num_workers=2,
                               resume_from=str(tmp_path / 'ref' / f'iter_{completed}.pth'))
        assert_states_equal(run(resumed), reference)


def test_resume_without_workers_uses_saved_global_rng(tmp_path):
    # num_workers=0: augmentation draws from the main process's generators, restored from the checkpoint.
    reference = run(make_trainer(tmp_path / 'ref'))
    resumed = make_trainer(tmp_path / 'resumed', resume_from=str(tmp_path / 'ref' / 'iter_8.pth'))
    assert_states_equal(run(resumed), reference)


def test_resume_skips_batches_without_loading_them(tmp_path):
    run(make_trainer(tmp_path / 'ref', max_epochs=2))
    k = 3
    data = AugmentedRegression(n=40)
    resumed = make_trainer(tmp_path / 'resumed', max_epochs=2, data=data,
                           resume_from=str(tmp_path / 'ref' / f'iter_{k}.pth'))
    run(resumed)
    # Epoch 1 from batch k, then all of epoch 2: never the k skipped batches.
    assert data.calls == (ITERS_PER_EPOCH - k) * 8 + ITERS_PER_EPOCH * 8


def test_seed_none_is_drawn_stored_and_reused_on_resume(tmp_path):
    first = make_trainer(tmp_path / 'ref', seed=None)
    reference = run(first)
    checkpoint = torch.load(tmp_path / 'ref' / 'iter_6.pth', weights_only=True)
    assert checkpoint['meta']['seed'] == first.seed
    resumed = make_trainer(tmp_path / 'resumed', seed=None, resume_from=str(tmp_path / 'ref' / 'iter_6.pth'))
    state = run(resumed)
    assert resumed.seed == first.seed
    assert_states_equal(state, reference)


def test_auto_resume_continues_from_pointer_and_starts_fresh_without_one(tmp_path):
    reference = run(make_trainer(tmp_path / 'ref', max_epochs=2))
    fresh = make_trainer(tmp_path / 'run', max_epochs=1, auto_resume=True)  # no pointer yet: a new run
    run(fresh)
    assert fresh.iter == ITERS_PER_EPOCH
    again = make_trainer(tmp_path / 'run', max_epochs=2, resume_from='auto')
    assert_states_equal(run(again), reference)


def test_user_dataloader_is_rebuilt_and_iterators_do_not_draw_from_global_rng(tmp_path):
    trainer = make_trainer(tmp_path, num_workers=2)
    loader = trainer.train_dataloader
    assert isinstance(loader.batch_sampler, ResumableBatchSampler)
    set_loader_epoch(loader, trainer.seed, 1, trainer.rank, 0)
    before = torch.get_rng_state()
    batches = iter(loader)
    assert torch.equal(torch.get_rng_state(), before)
    first = next(batches)
    del batches
    trainer.close()
    # The same batch from a loader with a different worker count: worker randomness is
    # seeded per batch, not per worker.
    other = make_trainer(tmp_path / 'one', num_workers=1).train_dataloader
    set_loader_epoch(other, trainer.seed, 1, trainer.rank, 0)
    again = next(iter(other))
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_resumed_iterator_reproduces_every_augmentation(tmp_path):
    trainer = make_trainer(tmp_path, num_workers=2)
    loader = trainer.train_dataloader
    set_loader_epoch(loader, trainer.seed, 2, trainer.rank, 0)
    full = list(loader)
    set_loader_epoch(loader, trainer.seed, 2, trainer.rank, 3)
    tail = list(loader)
    trainer.close()
    assert len(tail) == len(full) - 3
    for a, b in zip(full[3:], tail):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_resume_everything_on_matches_uninterrupted_run(tmp_path):
    # Accumulation (checkpoints inside a window), fp16 scaler, clipping, cosine LR, EMA, workers.
    options = dict(num_workers=2, max_epochs=3,
                   optimizer_config=dict(cumulative_iters=3, precision='fp16', grad_clip=dict(max_norm=1.0)),
                   lr_config=dict(policy='CosineAnnealing', min_lr=0.0, by_epoch=False))
    reference = run(make_trainer(tmp_path / 'ref', **options))
    for completed in (4, 5, 8):  # inside a window, at an epoch end mid-window, inside epoch 2
        path = tmp_path / 'ref' / f'iter_{completed}.pth'
        assert os.path.exists(path)
        resumed = make_trainer(tmp_path / f'resume_{completed}', resume_from=str(path), **options)
        assert_states_equal(run(resumed), reference)
