"""Distributed set-up without torchrun: argument errors, a one-rank gloo group in this
process (as ``torchrun --nproc-per-node 1`` would describe it), teardown, padding cuts."""
import socket

import pytest
import torch
import torch.distributed as torch_dist
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Trainer
from hookloop.dist import process_group as dist
from hookloop.data.resumable import ResumableBatchSampler
from hookloop.errors import ConfigError
from hookloop.engine.evaluator import real_samples, take_first
from hookloop.hooks.base import Hook

pytestmark = pytest.mark.skipif(not (torch_dist.is_available() and torch_dist.is_gloo_available()),
                                reason='torch.distributed with gloo is not available')


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun_env(monkeypatch):
    """The variables ``torchrun --nproc-per-node 1`` sets; the group is gone afterwards."""
    for key, value in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1',
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    yield
    dist.teardown()
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        monkeypatch.delenv(key, raising=False)


def trainer(tmp_path, **kwargs):
    torch.manual_seed(0)
    args = dict(model=Regressor(), optimizer=dict(type='SGD', lr=0.1),
                train_dataloader=DataLoader(regression_data(16), batch_size=4), max_iters=4,
                work_dir=str(tmp_path), device='cpu', log_config=dict(interval=100))
    args.update(kwargs)
    return Trainer(**args)


@pytest.mark.parametrize('kwargs, message', [
    (dict(launcher='slurm'), "launcher must be one of auto, none, pytorch, torchrun, got 'slurm'"),
    (dict(dist_timeout=0), 'dist_timeout must be a positive number of seconds, got 0'),
    (dict(dist_timeout='30'), "dist_timeout must be a positive number of seconds, got '30'"),
    (dict(dist_backend=3), 'dist_backend must be a backend name'),
    (dict(strategy='deepspeed'), "strategy must be one of none, ddp, fsdp, got 'deepspeed'"),
    (dict(strategy='ddp'), "strategy='ddp' needs torch.distributed: launch with torchrun"),
])
def test_bad_arguments_fail_before_training(tmp_path, no_torchrun_env, kwargs, message):
    with pytest.raises(ConfigError) as info:
        trainer(tmp_path, **kwargs)
    assert message in str(info.value)
    assert '\n' not in str(info.value)


def test_pytorch_launcher_needs_torchrun_env(tmp_path, no_torchrun_env):
    with pytest.raises(ConfigError, match=r"launcher='pytorch' needs the torchrun environment, but RANK, "
                                          r'WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set'):
        trainer(tmp_path, launcher='pytorch')


def test_auto_and_none_run_single_process(tmp_path, no_torchrun_env):
    t = trainer(tmp_path)
    assert (t.rank, t.world_size) == (0, 1) and t.wrapped_model is t.model
    assert not dist.is_distributed()


def test_launcher_none_ignores_torchrun_env(tmp_path, torchrun_env):
    t = trainer(tmp_path, launcher='none')
    assert not dist.is_distributed() and t.wrapped_model is t.model


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the error without CUDA')
def test_nccl_without_cuda_is_a_config_error(tmp_path, torchrun_env):
    with pytest.raises(ConfigError, match='dist_backend="nccl" needs CUDA'):
        trainer(tmp_path, dist_backend='nccl')


def plain_sgd(steps):
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = regression_data(16)
    for step in range(steps):
        x, y = data[step * 4:(step + 1) * 4]
        model(x, y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def test_one_rank_ddp_under_torchrun_env(tmp_path, torchrun_env):
    """The trainer joins the group torchrun describes, wraps in DDP when asked and trains
    like the plain loop; the group outlives ``close()`` (a later trainer reuses it) and
    ``dist.teardown()`` (run at exit) destroys it."""
    t = trainer(tmp_path, strategy='ddp')
    assert dist.is_distributed() and (t.rank, t.world_size) == (0, 1)
    assert type(t.wrapped_model).__name__ == 'DistributedDataParallel'
    assert t.wrapped_model.module is t.model and dist.unwrap_model(t.wrapped_model) is t.model
    t.train()
    reference = plain_sgd(4).state_dict()
    for key, value in t.model.state_dict().items():
        assert torch.allclose(value, reference[key], rtol=0, atol=1e-6), key
    assert dist.is_distributed()  # kept after a normal end: trainer.val() may follow
    t.close()
    group = torch_dist.group.WORLD
    again = trainer(tmp_path, strategy='ddp')
    assert torch_dist.group.WORLD is group and type(again.wrapped_model).__name__ == 'DistributedDataParallel'
    dist.teardown()
    assert not dist.is_distributed()


class Boom(Hook):
    def after_train_iter(self, trainer):
        raise ValueError('boom')


def test_error_tears_down_and_keeps_original_error(tmp_path, torchrun_env, capsys):
    t = trainer(tmp_path, strategy='ddp', custom_hooks=[Boom()])
    with pytest.raises(ValueError, match='boom'):
        t.train()
    assert not dist.is_distributed()  # torn down at once: peers waiting on us fail fast


def test_user_made_group_is_left_alone(tmp_path, no_torchrun_env):
    torch_dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)
    try:
        t = trainer(tmp_path, launcher='pytorch', strategy='ddp')
        assert type(t.wrapped_model).__name__ == 'DistributedDataParallel'
        t.close()
        assert torch_dist.is_initialized()
    finally:
        torch_dist.destroy_process_group()


def test_fsdp_refuses_a_built_optimizer(tmp_path, torchrun_env):
    pytest.importorskip('torch.distributed.fsdp', reason='no FSDP')
    from hookloop.dist.fsdp import fsdp2_available
    if not fsdp2_available():
        pytest.skip('this torch has no FSDP2')
    torch.manual_seed(0)
    model = Regressor()
    with pytest.raises(ConfigError, match='strategy="fsdp" replaces the parameters'):
        trainer(tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), strategy='fsdp')


def test_ddp_find_unused_parameters_must_be_bool(tmp_path, torchrun_env):
    with pytest.raises(ConfigError, match="find_unused_parameters must be True or False, got 'yes'"):
        trainer(tmp_path, strategy='ddp', find_unused_parameters='yes')


def test_real_samples_and_take_first():
    """13 samples over 2 ranks: rank 0 holds 7 real, rank 1 holds 6 real + 1 padding."""
    loaders = [DataLoader(regression_data(13), batch_sampler=ResumableBatchSampler(13, 4, rank=r, world_size=2))
               for r in range(2)]
    assert [real_samples(loader) for loader in loaders] == [7, 6]
    assert real_samples(DataLoader(regression_data(13), batch_size=4)) is None
    batch = (torch.arange(4.0), torch.arange(4) * 10)
    outputs = {'logits': torch.ones(4, 3), 'loss': torch.tensor(1.0)}
    kept_outputs, kept_batch, left = take_first(outputs, batch, 2)
    assert left == 0 and kept_outputs['logits'].shape == (2, 3) and kept_outputs['loss'].shape == ()
    assert torch.equal(kept_batch[1], torch.tensor([0, 10]))
    assert take_first(outputs, batch, 9)[2] == 5
    assert take_first(outputs, batch, 0) == (None, None, 0)


def test_sharded_directory_is_for_resume_only(tmp_path, no_torchrun_env):
    """A sharded checkpoint is a directory with hookloop.pth inside: accepted by
    resume_from (checked when training starts), refused by load_from up front."""
    from hookloop.checkpoint.format import CheckpointError
    from hookloop.checkpoint.sharded_files import is_sharded_checkpoint
    shard_dir = tmp_path / 'iter_6.pth'
    shard_dir.mkdir()
    assert not is_sharded_checkpoint(str(shard_dir))
    (shard_dir / 'hookloop.pth').write_bytes(b'')
    assert is_sharded_checkpoint(str(shard_dir))
    trainer(tmp_path / 'a', resume_from=str(shard_dir))
    with pytest.raises(CheckpointError, match='load_from .* does not exist or is not a file'):
        trainer(tmp_path / 'b', load_from=str(shard_dir))


def test_fsdp_save_inside_an_accumulation_window_is_refused(tmp_path, torchrun_env):
    """FSDP2 reduce-scatters each backward: gradients accumulated so far cannot be restored
    from a sharded checkpoint, so saving mid-window is refused, naming the fix."""
    from hookloop.errors import CheckpointError
    from hookloop.dist.fsdp import fsdp2_available
    if not fsdp2_available():
        pytest.skip('this torch has no FSDP2 (fully_shard)')
    t = trainer(tmp_path, strategy='fsdp', optimizer_config=dict(cumulative_iters=2),
                checkpoint_config=dict(interval=1, by_epoch=False))
    with pytest.raises(CheckpointError, match='inside a gradient-accumulation window.*multiple of cumulative_iters'):
        t.train()
    assert not (tmp_path / 'iter_1.pth').exists()
    t.close()
