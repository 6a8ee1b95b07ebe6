"""fp16's ``loss_scale`` and ``skipped_steps`` meters are not copied from the device at every step
(issue 26): the scale is copied only where it changes, a step's skip is known on the host. What the
meters hold, step by step, and what the logs report, are bitwise what the per-step copies gave."""
import pytest
import torch
from torch.utils.data import DataLoader

import hookloop.hooks.optimizer as optimizer_module
from hookloop import Hook, Trainer
import hookloop.optim.scale_book as scale_book_module
from hookloop.optim.scale_book import ScaleBook as _ScaleBook
from conftest import Regressor, regression_data
from log_utils import json_records
from resume_helpers import StopAt


def fp16_run(work_dir, loss_scale, cumulative_iters=1, epochs=3):
    torch.manual_seed(0)
    model = Regressor()
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(regression_data(), batch_size=4), max_epochs=epochs,
                      work_dir=str(work_dir), seed=0, device='cpu', log_level='WARNING',
                      optimizer_config=dict(precision='fp16', loss_scale=loss_scale, cumulative_iters=cumulative_iters),
                      log_config=dict(interval=3, hooks=[dict(type='TextLoggerHook')]))
    trainer.train()
    trainer.close()
    trainer.meters.keys()  # a read: the values still in the bulk series join the buffer
    history = {key: [float(v) for v in trainer.meters._values[key]] for key in ('loss_scale', 'skipped_steps')}
    records = [{k: v for k, v in r.items() if k not in ('time', 'data_time')} for r in json_records(str(work_dir))]
    return history, records, model.state_dict()  # (times: the machine's, not the meters')


def per_step_way(monkeypatch):
    """The way before issue 26 (kept for optimizers that skip steps themselves): per-step copies."""
    monkeypatch.setattr(_ScaleBook, 'attach', classmethod(lambda cls, scaler, optimizer, static: None))


CASES = {
    # overflow: steps skipped and the scale backed off, then growth every 2 finite steps
    'dynamic': dict(loss_scale=dict(init_scale=2. ** 18, growth_factor=2., backoff_factor=0.5, growth_interval=2)),
    # factors whose products round in float32
    'odd_factors': dict(loss_scale=dict(init_scale=3. ** 11, growth_factor=1.7, backoff_factor=0.3, growth_interval=3)),
    'accumulation': dict(loss_scale=dict(init_scale=2. ** 17, growth_interval=1), cumulative_iters=2),
    # static: every step overflows, the run of skipped steps grows, the scale stays
    'static_overflow': dict(loss_scale=2. ** 40, epochs=1),  # (20 in a row stop the run: FiniteLossGuard)
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_scale_and_skip_history_equal_the_per_step_copies(tmp_path, monkeypatch, case):
    copies = []
    original = optimizer_module.scale_tensor
    for module in (optimizer_module, scale_book_module):  # the per-step path and the book
        monkeypatch.setattr(module, 'scale_tensor', lambda scaler: copies.append(1) or original(scaler))
    history, records, weights = fp16_run(tmp_path / 'new', **CASES[case])
    new_copies = len(copies)
    per_step_way(monkeypatch)
    copies.clear()
    want_history, want_records, want_weights = fp16_run(tmp_path / 'old', **CASES[case])
    assert history == want_history
    assert records == want_records and 'loss_scale' in records[0]  # the logged averages
    assert all(torch.equal(weights[k], want_weights[k]) for k in weights)
    scales, skipped = history['loss_scale'], history['skipped_steps']
    changes = sum(a != b for a, b in zip(scales, scales[1:]))
    assert len(copies) == len(scales)  # the per-step way: a copy per step
    assert new_copies == 1 + changes  # a copy at the first step and where the scale changed, none elsewhere
    if case == 'dynamic':
        assert new_copies < len(scales)
    if case == 'static_overflow':
        assert set(scales) == {2. ** 40} and skipped == [float(n) for n in range(1, len(skipped) + 1)]
        assert new_copies == 1
    else:
        assert any(b < a for a, b in zip(scales, scales[1:])), 'no back-off: the test proves nothing'
        assert any(b > a for a, b in zip(scales, scales[1:])), 'no growth: the test proves nothing'
        assert max(skipped) >= 1


def test_a_loaded_scaler_state_is_followed(tmp_path, monkeypatch):
    """A resume replaces the scaler's scale and growth tracker: the next steps report that state."""
    def two_parts(work_dir):
        first = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(
            regression_data(), batch_size=4), max_epochs=1, work_dir=str(work_dir / 'a'), seed=0, device='cpu',
            log_level='WARNING', optimizer_config=dict(precision='fp16', loss_scale=dict(init_scale=2. ** 18,
                                                                                          growth_interval=3)))
        first.train()
        state = next(h for h in first.hooks if h.name == 'OptimizerHook').state_dict()
        first.close()
        torch.manual_seed(1)
        second = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(
            regression_data(), batch_size=4), max_epochs=2, work_dir=str(work_dir / 'b'), seed=0, device='cpu',
            log_level='WARNING', optimizer_config=dict(precision='fp16', loss_scale=dict(init_scale=4.,
                                                                                           growth_interval=3)))
        second.resolve_hooks()
        next(h for h in second.hooks if h.name == 'OptimizerHook').load_state_dict(state)  # what a resume does
        second.train()
        second.close()
        second.meters.keys()
        return [float(v) for v in second.meters._values['loss_scale']], state['scaler']

    scales, loaded = two_parts(tmp_path / 'new')
    per_step_way(monkeypatch)
    want, _ = two_parts(tmp_path / 'old')
    assert scales == want and scales[0] != 4. and loaded['_growth_tracker'] != 0


def test_optimizers_that_skip_steps_themselves_keep_the_per_step_way():
    scaler = torch.amp.GradScaler('cpu')
    parameter = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    book = _ScaleBook.attach(scaler, optimizer, static=False)
    assert book is not None
    book.close()
    optimizer._step_supports_amp_scaling = True  # what the fused optimizers declare
    assert _ScaleBook.attach(scaler, optimizer, static=False) is None


def _optimizer_hook(trainer):
    return next(h for h in trainer.hooks if h.name == 'OptimizerHook')


class _Fails(Hook):
    def after_train_iter(self, trainer):
        if trainer.iter == 2:
            raise RuntimeError('a hook fails')


@pytest.mark.parametrize('fails', [False, True])
def test_the_users_optimizer_keeps_no_hook_of_the_run(tmp_path, fails):
    """The step hook that counts fp16's steps is taken off the optimizer when the run ends, also
    when it ends in an error: the user's optimizer outlives the trainer."""
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = Trainer(model, optimizer=optimizer, train_dataloader=DataLoader(regression_data(), batch_size=4),
                      max_epochs=1, work_dir=str(tmp_path), seed=0, device='cpu', log_level='WARNING',
                      optimizer_config=dict(precision='fp16'), custom_hooks=[_Fails()] if fails else [])
    if fails:
        with pytest.raises(RuntimeError, match='a hook fails'):
            trainer.train()
    else:
        trainer.train()
    trainer.close()
    assert _optimizer_hook(trainer).processor._scale_book is not None  # the book was used
    assert not optimizer._optimizer_step_post_hooks


def test_a_later_run_counts_its_steps_again(tmp_path, monkeypatch):
    """A ``train()`` after a stop puts the step hook back: its meters are the per-step way's,
    bitwise, and copy the scale only where it changes (not at every step)."""
    copies = []
    original = optimizer_module.scale_tensor
    for module in (optimizer_module, scale_book_module):
        monkeypatch.setattr(module, 'scale_tensor', lambda scaler: copies.append(1) or original(scaler))

    def two_runs(work_dir):
        torch.manual_seed(0)
        trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                          train_dataloader=DataLoader(regression_data(), batch_size=4), max_epochs=3,
                          work_dir=str(work_dir), seed=0, device='cpu', log_level='WARNING',
                          optimizer_config=dict(precision='fp16', **CASES['dynamic']),
                          custom_hooks=[StopAt(6)])  # a stop after 7 iterations
        trainer.train()
        copies.clear()
        trainer.train()  # goes on from iteration 7
        trainer.close()
        trainer.meters.keys()
        return [float(v) for v in trainer.meters._values['loss_scale']], len(copies)

    scales, book_copies = two_runs(tmp_path / 'new')
    per_step_way(monkeypatch)
    want, step_copies = two_runs(tmp_path / 'old')
    assert scales == want
    assert book_copies < step_copies  # the second run took the book's way, not the per-step one
