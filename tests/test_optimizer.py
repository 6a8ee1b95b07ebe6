"""OptimizerHook: accumulation, clipping, config forms and errors, against plain PyTorch loops."""
import contextlib
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from hookloop import ConfigError, Hook, Trainer
from hookloop.checkpoint.format import load_checkpoint
from hookloop.hooks.optimizer import OptimizerHook, OptimizerProcessor, accumulation_window
from conftest import Regressor, regression_data


def fresh_pair(seed=0, **kwargs):
    torch.manual_seed(seed)
    model = Regressor(**kwargs)
    reference = Regressor(**kwargs)
    reference.load_state_dict(model.state_dict())
    return model, reference


def train(tmp_path, model, data, batch_size=8, max_epochs=2, max_iters=None, optimizer=None, **kwargs):
    loader = DataLoader(data, batch_size=batch_size)
    kwargs.setdefault('log_config', dict(interval=1000))  # meters keep every value of these short runs
    trainer = Trainer(model, optimizer=optimizer or dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=loader, max_epochs=None if max_iters else max_epochs, max_iters=max_iters,
                      work_dir=tmp_path, seed=0, device='cpu', **kwargs)
    trainer.train()
    trainer.close()
    return trainer


def assert_same_weights(model, reference, atol=None):
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        if atol is None:
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=name)


def plain_accumulation(reference, data, batch_size, epochs, n, total_iters=None):
    """The textbook loop: loss / (real window size), step at window end and epoch end."""
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    done = 0
    for _ in range(epochs):
        batches = list(DataLoader(data, batch_size=batch_size))
        if total_iters is not None:
            batches = batches[:total_iters - done]
        for start in range(0, len(batches), n):
            window = batches[start:start + n]
            for x, y in window:
                (reference(x, y) / len(window)).backward()
            optimizer.step()
            optimizer.zero_grad()
        done += len(batches)


# -- pure window math ------------------------------------------------------------------------
def test_accumulation_window_restarts_each_epoch_and_shortens_the_last():
    assert [accumulation_window(i, 5, 2) for i in range(5)] == [(0, 2), (0, 2), (2, 2), (2, 2), (4, 1)]
    def window_end(inner_iter, length, n):
        start, size = accumulation_window(inner_iter, length, n)
        return inner_iter == start + size - 1
    assert [window_end(i, 7, 3) for i in range(7)] == [False, False, True, False, False, True, True]
    assert all(window_end(i, 4, 1) for i in range(4))


# -- accumulation ----------------------------------------------------------------------------
@pytest.mark.parametrize('n', [1, 2, 3, 4])
def test_accumulation_matches_plain_loop_with_short_last_window(tmp_path, n):
    data = regression_data(n=38)  # 5 batches of 8 (last one 6): not divisible by 8*n for n > 1
    model, reference = fresh_pair()
    train(tmp_path, model, data, optimizer_config=dict(cumulative_iters=n))
    plain_accumulation(reference, data, 8, 2, n)
    assert_same_weights(model, reference)


def test_accumulation_equals_one_big_batch(tmp_path):
    data = regression_data(n=48)  # 6 equal batches; windows of 4 then 2 -> batches of 32 and 16
    model, reference = fresh_pair()
    train(tmp_path, model, data, optimizer=dict(type='SGD', lr=0.05),
          optimizer_config=dict(type='GradientCumulativeOptimizerHook', cumulative_iters=4))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _ in range(2):
        for x, y in DataLoader(data, batch_size=32):
            reference(x, y).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert_same_weights(model, reference, atol=1e-6)


def test_accumulation_iteration_based_run_steps_at_run_end(tmp_path):
    data = regression_data(n=40)  # 5 iterations per epoch; 8 iterations -> the second epoch has 3
    model, reference = fresh_pair()
    train(tmp_path, model, data, max_iters=8, optimizer_config=dict(cumulative_iters=2))
    plain_accumulation(reference, data, 8, 2, 2, total_iters=8)
    assert_same_weights(model, reference)


# -- clipping --------------------------------------------------------------------------------
class NormRecorder(Hook):
    """Copies the grad_norm meter (after the optimizer hook wrote it)."""
    PRIORITY = 'LOWEST'

    def __init__(self):
        self.norms = []

    def after_train_iter(self, trainer):
        self.norms = list(trainer.meters._values.get('grad_norm', []))


@pytest.mark.parametrize('norm_type', [2, 1, 'inf'])
def test_norm_clipping_matches_clip_grad_norm(tmp_path, norm_type):
    data = regression_data()
    model, reference = fresh_pair()
    recorder = NormRecorder()
    train(tmp_path, model, data, optimizer_config=dict(grad_clip=dict(max_norm=0.5, norm_type=norm_type)),
          custom_hooks=[recorder])
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    norms = []
    for _ in range(2):
        for x, y in DataLoader(data, batch_size=8):
            reference(x, y).backward()
            norms.append(nn.utils.clip_grad_norm_(reference.parameters(), 0.5, norm_type=float(norm_type)))
            optimizer.step()
            optimizer.zero_grad()
    assert_same_weights(model, reference)
    # grad_norm is logged before clipping, as device tensors (the logger syncs once per interval)
    assert len(recorder.norms) == 10 and all(isinstance(t, torch.Tensor) for t in recorder.norms)
    assert torch.equal(torch.stack(recorder.norms), torch.stack(norms))
    assert max(t.item() for t in norms) > 0.5  # clipping really happened


def test_value_clipping_matches_clip_grad_value(tmp_path):
    data = regression_data()
    model, reference = fresh_pair()
    train(tmp_path, model, data, optimizer_config=dict(grad_clip=dict(clip_value=0.1)))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for _ in range(2):
        for x, y in DataLoader(data, batch_size=8):
            reference(x, y).backward()
            nn.utils.clip_grad_value_(reference.parameters(), 0.1)
            optimizer.step()
            optimizer.zero_grad()
    assert_same_weights(model, reference)


# -- configuration and errors ----------------------------------------------------------------
def make_trainer(tmp_path, **kwargs):
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.1), train_dataloader=DataLoader(regression_data(), 8),
                   max_epochs=1, work_dir=tmp_path, seed=0, device='cpu', **kwargs)


def test_two_optimizer_hooks_are_refused_at_registration(tmp_path):
    trainer = make_trainer(tmp_path, optimizer_config=dict(type='OptimizerHook'))
    with pytest.raises(ConfigError, match='GradientCumulativeOptimizerHook.*OptimizerHook is already registered'):
        trainer.register_hook(dict(type='GradientCumulativeOptimizerHook', cumulative_iters=2))
    with pytest.raises(ConfigError, match='Fp16OptimizerHook.*OptimizerHook'):
        make_trainer(tmp_path, optimizer_config=dict(type='OptimizerHook'),
                     custom_hooks=[dict(type='Fp16OptimizerHook')])


@pytest.mark.parametrize('kwargs, message', [
    (dict(cumulative_iters=0), 'cumulative_iters must be a positive int, got 0'),
    (dict(cumulative_iters=2.0), 'cumulative_iters must be a positive int, got 2.0'),
    (dict(cumulative_iters=True), 'cumulative_iters must be a positive int, got True'),
    (dict(grad_clip=dict(max_norm=1, norm_type='foo')), "norm_type must be a positive number or 'inf', got 'foo'"),
    (dict(grad_clip=dict(max_norm=-1)), 'needs max_norm, a positive number, got -1'),
    (dict(grad_clip=dict(norm_type=2)), 'needs max_norm'),
    (dict(grad_clip=dict(max_norm=1, clip_value=1)), 'clip_value .* takes no other keys'),
    (dict(grad_clip=dict(max_norm=1, foo=1)), "unknown keys \\['foo'\\]"),
    (dict(grad_clip=1.0), 'grad_clip must be None or a dict'),
    (dict(precision='fp8'), "precision must be one of None, 'fp32', 'fp16', 'bf16', got 'fp8'"),
    (dict(precision='bf16', loss_scale=512.), "loss_scale=512.0 needs precision='fp16', got 'bf16'"),
    (dict(loss_scale=-1), 'loss_scale must be a positive finite number, got -1'),
    (dict(loss_scale='static'), "loss_scale must be 'dynamic', a positive number or a dict"),
    (dict(loss_scale=dict(init_scale=8, grow=2)), "loss_scale got unknown keys \\['grow'\\]"),
    (dict(loss_keys=[]), 'loss_keys must be a key or a list of keys'),
    (dict(detect_anomalous_params='yes'), 'detect_anomalous_params must be True or False'),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        OptimizerHook(**kwargs)


def test_bad_argument_through_config_names_the_config_type(tmp_path):
    with pytest.raises(ConfigError, match='GradientCumulativeOptimizerHook cumulative_iters .* got 0'):
        make_trainer(tmp_path, optimizer_config=dict(type='GradientCumulativeOptimizerHook', cumulative_iters=0))


def test_config_forms_build_the_one_hook(tmp_path):
    for cfg, expected in [
            (dict(precision='bf16'), ('bf16', 1)),
            (dict(type='Fp16OptimizerHook', loss_scale='dynamic'), ('fp16', 1)),
            (dict(type='Fp16OptimizerHook', distributed=True, coalesce=True, bucket_size_mb=-1), ('fp16', 1)),
            (dict(type='GradientCumulativeOptimizerHook', cumulative_iters=3), (None, 3)),
            (dict(loss_scale=128.), ('fp16', 1))]:
        trainer = make_trainer(tmp_path, optimizer_config=cfg)
        hook, = [h for h in trainer.hooks if h.ROLE == 'optimizer']
        assert isinstance(hook, OptimizerHook) and hook.name == 'OptimizerHook'
        assert (hook.precision, hook.cumulative_iters) == expected
        trainer.close()


def test_fp16_without_float32_parameters_is_refused_before_training(tmp_path):
    frozen = Regressor().requires_grad_(False)
    frozen.extra = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    trainer = Trainer(frozen, optimizer=torch.optim.SGD([frozen.extra], lr=0.1),
                      train_dataloader=DataLoader(regression_data(), 8), max_epochs=1, work_dir=tmp_path, seed=0,
                      device='cpu', optimizer_config=dict(precision='fp16'))
    with pytest.raises(ConfigError, match="precision='fp16' needs trainable float32 parameters.*torch.float64"):
        trainer.train()
    assert trainer.iter == 0
    half = Regressor().half()
    trainer = Trainer(half, optimizer=dict(type='SGD', lr=0.1), train_dataloader=DataLoader(regression_data(), 8),
                      max_epochs=1, work_dir=tmp_path, seed=0, device='cpu', optimizer_config=dict(precision='fp16'))
    with pytest.raises(ConfigError, match='float32 parameters'):
        trainer.train()


# -- DDP no_sync -----------------------------------------------------------------------------
class FakeDDP(nn.Module):
    """Records, per forward, whether it ran inside ``no_sync`` (DDP decides at forward time)."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.syncing = True
        self.forwards = []

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def forward(self, *args):
        self.forwards.append((self.syncing, torch.is_autocast_enabled('cpu')))
        return self.module(*args)


@pytest.mark.parametrize('precision', [None, 'bf16'])
def test_no_sync_inside_windows_combined_with_autocast(tmp_path, precision):
    trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.1),
                      train_dataloader=DataLoader(regression_data(), 8), max_epochs=2, work_dir=tmp_path, seed=0,
                      device='cpu',
                      optimizer_config=dict(cumulative_iters=2, precision=precision))
    trainer.wrapped_model = FakeDDP(trainer.model)
    trainer.train()
    trainer.close()
    # 5 iterations per epoch, windows [0,1] [2,3] [4]: gradients are reduced at 1, 3, 4
    assert [s for s, _ in trainer.wrapped_model.forwards] == [False, True, False, True, True] * 2
    assert all(a == (precision is not None) for _, a in trainer.wrapped_model.forwards)


def test_real_single_process_ddp_accumulation_matches_plain_loop(tmp_path, monkeypatch):
    import torch.distributed as dist
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', str(29500 + (hash(str(tmp_path)) % 2000)))
    dist.init_process_group('gloo', rank=0, world_size=1)
    try:
        data = regression_data(n=38)
        model, reference = fresh_pair()
        loader = DataLoader(data, batch_size=8)
        trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                          max_epochs=2, work_dir=tmp_path, seed=0, device='cpu',
                          optimizer_config=dict(cumulative_iters=3), launcher='none')
        trainer.wrapped_model = nn.parallel.DistributedDataParallel(model)
        trainer.train()
        trainer.close()
    finally:
        dist.destroy_process_group()
    plain_accumulation(reference, data, 8, 2, 3)
    assert_same_weights(model, reference, atol=1e-7)


# -- anomalous parameters, processor swap ----------------------------------------------------
class WithUnused(Regressor):
    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(2, 2)


def test_detect_anomalous_params_logs_unused_parameters_once(tmp_path):
    trainer = Trainer(WithUnused(), optimizer=dict(type='SGD', lr=0.1),
                      train_dataloader=DataLoader(regression_data(), 8), max_epochs=2, work_dir=tmp_path, seed=0,
                      device='cpu',
                      optimizer_config=dict(detect_anomalous_params=True))
    trainer.train()
    trainer.close()
    log = open(next(tmp_path.glob('*.log'))).read()
    assert log.count('got no gradient') == 1
    assert 'unused.weight, unused.bias' in log and 'net.0.weight' not in log.split('got no gradient')[1]


def test_set_processor_replaces_backward_and_step(tmp_path):
    calls = []

    class Recording(OptimizerProcessor):
        def backward(self, trainer, loss_keys, cumulative_iters, grad_clip):
            calls.append((trainer.iter, cumulative_iters))
            super().backward(trainer, loss_keys, cumulative_iters, grad_clip)

    data = regression_data(n=38)
    model, reference = fresh_pair()
    hook = OptimizerHook(cumulative_iters=2)
    hook.set_processor(Recording())
    train(tmp_path, model, data, optimizer_config=hook)
    plain_accumulation(reference, data, 8, 2, 2)
    assert_same_weights(model, reference)
    assert calls == [(i, 2) for i in range(10)]


# -- exact resume inside an accumulation window ----------------------------------------------
class SaveAndStop(Hook):
    """Saves a checkpoint after iteration ``at`` (after the optimizer hook) and stops."""
    PRIORITY = 'LOW'

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter == self.at:
            trainer.save_checkpoint('mid.pth')
            trainer.request_stop('test')


@pytest.mark.parametrize('precision', [None, 'fp16'])
def test_resume_inside_accumulation_window_matches_uninterrupted_run(tmp_path, precision):
    data = regression_data(n=38)
    cfg = dict(cumulative_iters=3, precision=precision, grad_clip=dict(max_norm=1.0))
    if precision == 'fp16':
        cfg['loss_scale'] = dict(init_scale=2. ** 10, growth_interval=1)  # grows, then overflows after the resume
    full, _ = fresh_pair()
    train(tmp_path / 'full', full, data, max_epochs=3, optimizer_config=dict(cfg))

    first, _ = fresh_pair()
    train(tmp_path / 'a', first, data, max_epochs=3, optimizer_config=dict(cfg), custom_hooks=[SaveAndStop(at=11)])
    checkpoint = load_checkpoint(str(tmp_path / 'a' / 'mid.pth'))
    state = checkpoint['hooks']['OptimizerHook']
    assert state['grads'] and all(g is not None for g in state['grads'])  # iteration 11 is inside window [10, 12]
    assert ('scaler' in state) == (precision == 'fp16')

    second, _ = fresh_pair(seed=1)  # different initial weights: everything must come from the checkpoint
    train(tmp_path / 'b', second, data, max_epochs=3, optimizer_config=dict(cfg),
          resume_from=str(tmp_path / 'a' / 'mid.pth'))
    assert_same_weights(second, full)
    assert all(math.isfinite(v.abs().max().item()) for v in full.state_dict().values())


# -- no hidden host sync ---------------------------------------------------------------------
class SyncCounter(OptimizerProcessor):
    """Counts tensor -> Python conversions (the host syncs on a GPU) made during backward/step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.syncs = 0

    def backward(self, trainer, loss_keys, cumulative_iters, grad_clip):
        patched = {name: getattr(torch.Tensor, name) for name in ('item', 'tolist', '__bool__', '__float__')}

        def counting(original):
            def wrapper(*args, **kwargs):
                self.syncs += 1
                return original(*args, **kwargs)
            return wrapper
        try:
            for name, original in patched.items():
                setattr(torch.Tensor, name, counting(original))
            super().backward(trainer, loss_keys, cumulative_iters, grad_clip)
        finally:
            for name, original in patched.items():
                setattr(torch.Tensor, name, original)


@pytest.mark.parametrize('precision, syncs_per_step', [(None, 0), ('bf16', 0), ('fp16', 1)])
def test_no_host_sync_per_step_except_the_documented_fp16_one(tmp_path, precision, syncs_per_step):
    hook = OptimizerHook(cumulative_iters=2, grad_clip=dict(max_norm=0.5), precision=precision)
    hook.set_processor(SyncCounter(precision))
    train(tmp_path, Regressor(), regression_data(n=40), optimizer_config=hook)
    steps = 2 * 3  # windows [0,1] [2,3] [4] in each of 2 epochs
    assert hook.processor.syncs == syncs_per_step * steps
