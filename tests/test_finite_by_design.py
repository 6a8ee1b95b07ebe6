"""The finite check judges what training produces, never values non-finite by design (issue 36,
item 1): a causal-mask buffer (0 / -inf), a hook's ``best = inf`` sentinel, a sparse buffer, the
EMA copies of such buffers; while a NaN/inf that training brings anywhere is still refused."""
import math
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Hook, Trainer
from hookloop.checkpoint.finite_state import FiniteBaseline, check_finite_state, is_finite, non_finite_entries
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import InvalidLossError

CAUSAL = torch.nn.Transformer.generate_square_subsequent_mask(4)


def sparse_buffer():
    return torch.sparse_coo_tensor(torch.tensor([[0, 2], [1, 3]]), torch.tensor([0.5, -1.5]), (4, 4))


class Masked(Regressor):
    """A regressor carrying a causal-mask buffer and a sparse buffer (its forward does not read
    them: a NaN put there reaches no loss, only the check can see it)."""

    def __init__(self):
        super().__init__()
        self.register_buffer('mask', CAUSAL.clone())
        self.register_buffer('adjacency', sparse_buffer())


class EarlyStop(Hook):
    """The usual early-stopping state: ``best = inf`` until a first validation."""

    def __init__(self):
        self.best, self.history = math.inf, torch.tensor([math.inf, -math.inf])

    def state_dict(self):
        return {'best': self.best, 'history': self.history.clone()}

    def load_state_dict(self, state):
        self.best, self.history = state['best'], state['history'].clone()


class Poison(Hook):
    """At iteration ``at`` (after the step) set ``where(model)`` to ``value`` at ``index``: a
    stand-in for a NaN that training brings into a buffer or a weight."""

    def __init__(self, at, where, index, value):
        self.at, self.where, self.index, self.value = at, where, index, value

    def after_train_iter(self, trainer):
        if trainer.iter == self.at:
            with torch.no_grad():
                target = self.where(trainer.model)
                (target._values() if target.is_sparse else target)[self.index] = self.value


def make_trainer(work_dir, hooks=(), **kwargs):
    torch.manual_seed(0)
    return Trainer(Masked(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                   train_dataloader=DataLoader(regression_data(), 8), max_iters=6, work_dir=str(work_dir), seed=0,
                   device='cpu', log_config=dict(interval=100), custom_hooks=list(hooks), **kwargs)


@pytest.mark.parametrize('async_save', [False, True], ids=['sync', 'async'])
def test_a_model_with_a_causal_mask_and_a_sparse_buffer_saves_every_checkpoint(tmp_path, async_save):
    trainer = make_trainer(tmp_path, [EarlyStop(), dict(type='EMAHook', momentum=0.5, warm_up=1)],
                           checkpoint_config=dict(interval=2, by_epoch=False, async_save=async_save))
    trainer.train()
    trainer.close()
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == ['iter_2.pth', 'iter_4.pth', 'iter_6.pth']
    checkpoint = load_checkpoint(str(tmp_path / 'iter_6.pth'))
    assert torch.equal(checkpoint['state_dict']['mask'], CAUSAL)
    assert torch.equal(checkpoint['ema_state_dict']['mask'], CAUSAL)  # the EMA's copy, judged like the buffer
    assert torch.equal(checkpoint['state_dict']['adjacency'].to_dense(), sparse_buffer().to_dense())
    assert checkpoint['hooks']['EarlyStop']['best'] == math.inf
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_6.pth')


def test_a_resumed_run_keeps_saving_its_mask(tmp_path):
    first = make_trainer(tmp_path, [EarlyStop()], checkpoint_config=dict(interval=3, by_epoch=False))
    first.max_iters = 3
    first.train()
    first.close()
    resumed = make_trainer(tmp_path, [EarlyStop()], checkpoint_config=dict(interval=3, by_epoch=False),
                           resume_from='auto')
    resumed.train()
    resumed.close()
    assert torch.equal(load_checkpoint(str(tmp_path / 'iter_6.pth'))['state_dict']['mask'], CAUSAL)


SAVE_REFUSED = r'not saving .*iter_4\.pth: .*NaN/inf in model weight '


@pytest.mark.parametrize('where, index, value, message', [
    (lambda m: m.mask, (0, 0), -math.inf, SAVE_REFUSED + 'mask'),        # a new -inf where the mask had 0
    (lambda m: m.mask, (0, 3), math.inf, SAVE_REFUSED + 'mask'),         # -inf turned +inf
    (lambda m: m.mask, (1, 2), math.nan, SAVE_REFUSED + 'mask'),
    (lambda m: m.adjacency, 1, math.nan, SAVE_REFUSED + 'adjacency'),    # a sparse buffer's value
    (lambda m: m.net[0].weight, (0, 0), math.nan, r'non-finite loss .* seen before saving by iteration 4'),
], ids=['new-inf', 'flipped-inf', 'nan-in-mask', 'nan-in-sparse', 'nan-weight'])
def test_a_non_finite_value_training_brings_is_still_refused(tmp_path, where, index, value, message):
    trainer = make_trainer(tmp_path, [EarlyStop(), Poison(2, where, index, value)],
                           checkpoint_config=dict(interval=2, by_epoch=False))
    with pytest.raises(InvalidLossError, match=message):
        trainer.train()
    trainer.close()
    assert read_pointer(tmp_path) == str(tmp_path / 'iter_2.pth')
    assert not (tmp_path / 'iter_4.pth').exists()


def test_a_hook_sentinel_that_turns_nan_is_refused():
    baseline = FiniteBaseline.of({'hooks': {'EarlyStop': {'best': math.inf}}})
    state = {'hooks': {'EarlyStop': {'best': math.inf}}}
    assert is_finite(state, baseline=baseline)
    assert is_finite({'hooks': {'EarlyStop': {'best': 0.25}}}, baseline=baseline)  # finite is always fine
    for bad in (math.nan, -math.inf):
        state = {'hooks': {'EarlyStop': {'best': bad}}}
        assert not is_finite(state, baseline=baseline)
        assert non_finite_entries(state, baseline=baseline) == ['hook state EarlyStop.best']
    # another hook's entry of the same name is not covered by EarlyStop's sentinel
    assert not is_finite({'hooks': {'Other': {'best': math.inf}}}, baseline=baseline)


def test_sparse_tensors_are_judged_by_their_values_in_every_layout():
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    for tensor in (dense.to_sparse(), dense.to_sparse_csr(), dense.to_sparse_csc(),
                   torch.sparse_coo_tensor(torch.tensor([[0, 0], [1, 1]]), torch.tensor([1.0, 2.0]), (2, 2))):
        check_finite_state({'state_dict': {'s': tensor}}, 'x.pth')  # before: NotImplementedError ('SparseCPU')
    bad = torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([math.nan]), (2, 2))
    with pytest.raises(InvalidLossError, match=r'model weight s\b'):
        check_finite_state({'state_dict': {'s': bad}}, 'x.pth')


def test_copies_of_a_by_design_value_are_judged_like_the_original():
    baseline = FiniteBaseline.of({'state_dict': {'blocks.0.mask': CAUSAL}})
    assert baseline.names() == ['blocks.0.mask', 'state_dict.blocks.0.mask']
    copies = {'state_dict': {'blocks.0.mask': CAUSAL.clone()}, 'ema_state_dict': {'blocks.0.mask': CAUSAL.clone()},
              'hooks': {'EMAHook': {'averages': {'blocks.0.mask': CAUSAL.clone()}}}}
    assert is_finite(copies, baseline=baseline)
    other = {'ema_state_dict': {'blocks.1.mask': CAUSAL.clone()}}  # another buffer: not by design
    assert not is_finite(other, baseline=baseline)
    half = {'ema_state_dict': {'blocks.0.mask': CAUSAL.half()}}  # the same numbers in another dtype
    assert is_finite(half, baseline=baseline)
