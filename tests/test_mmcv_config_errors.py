"""MMCV configs that cannot run say why in one error, every problem at once (issue 39 items 5,
7 and 8): unknown types and policies together, mmselfsup's ``paramwise_options`` named for what
it is, and an ``optimizer_config`` beside several optimizers a ``train_step`` model steps."""
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from conftest import Regressor, regression_data
from hookloop.compat.build import build_trainer
from hookloop.compat.mmcv.trainer import MMCVTrainer
from hookloop.compat.mmcv_config import translate
from hookloop.errors import ConfigError
from hookloop.registry import OPTIMIZERS


def config(tmp_path, **extra):
    cfg = dict(model=Regressor(), optimizer=dict(type='SGD', lr=0.01), runner=dict(type='EpochBasedRunner',
               max_epochs=1), data=dict(samples_per_gpu=4, workers_per_gpu=0, train=regression_data(8)), seed=0,
               device='cpu', work_dir=str(tmp_path / 'run'))
    cfg.update(extra)
    return cfg


def test_every_unknown_type_in_one_error(tmp_path):
    cfg = config(tmp_path, optimizer=dict(type='LARS', lr=4.8), lr_config=dict(policy='CosineAnealing'),
                 momentum_config=dict(policy='cyclc'), custom_hooks=[dict(type='BYOLHook')],
                 log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook'), dict(type='TensorbordLoggerHook')]),
                 model=dict(type='BYOL', backbone=dict(type='ResNet')))
    with pytest.raises(ConfigError) as error:
        build_trainer(default_args=cfg)
    message = str(error.value)
    assert message.startswith('the config has 6 problems:')
    for where, name in (('model', "'BYOL'"), ('optimizer', "'LARS'"), ('lr_config', "'CosineAnealing'"),
                        ('momentum_config', "'cyclc'"), ('log_config.hooks[1]', "'TensorbordLoggerHook'"),
                        ('custom_hooks[0]', "'BYOLHook'")):
        assert any(line.startswith(f'  - {where}: ') and name in line for line in message.splitlines()), where
    assert 'closest: CosineAnnealing' in message and 'closest: TensorboardLoggerHook' in message
    assert not (tmp_path / 'run').exists() or not any((tmp_path / 'run').iterdir())  # nothing written


class LarsLike(torch.optim.SGD):
    def __init__(self, params, lr, momentum=0, weight_decay=0, eta=0.001):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def test_mmselfsup_paramwise_options_is_named_for_what_it_is(tmp_path):
    OPTIMIZERS.register_module(module=LarsLike, force=True)
    cfg = config(tmp_path, optimizer=dict(type='LarsLike', lr=4.8, paramwise_options={'bias': dict(weight_decay=0.)}))
    with pytest.raises(ConfigError, match=r"^optimizer paramwise_options is mmselfsup's key") as error:
        build_trainer(default_args=cfg)
    assert 'did you mean' not in str(error.value) and '\n' not in str(error.value)


class TwoPlayer(nn.Module):
    """mmhuman3d's HMR contract in small: train_step steps each optimizer itself."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.generator, self.critic = nn.Linear(2, 2), nn.Linear(2, 1)

    def train_step(self, data_batch, optimizer, **kwargs):
        (x,) = data_batch
        optimizer['critic'].zero_grad()
        loss_c = (self.critic(x) - self.critic(self.generator(x).detach())).mean()
        loss_c.backward()
        optimizer['critic'].step()
        optimizer['generator'].zero_grad()
        loss_g = -self.critic(self.generator(x)).mean()
        loss_g.backward()
        optimizer['generator'].step()
        return dict(loss=loss_g.detach(), log_vars=dict(loss_c=loss_c.item(), loss_g=loss_g.item()),
                    num_samples=len(x))


def test_optimizer_config_beside_optimizers_a_train_step_steps(tmp_path):
    data = TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0)))
    optimizers = dict(generator=dict(type='Adam', lr=1e-3), critic=dict(type='SGD', lr=1e-2))
    # mmhuman3d's HMR configs: optimizer_config=dict(grad_clip=None) -> not used, said once, and it trains
    cfg = config(tmp_path, model=TwoPlayer(), optimizer=optimizers, optimizer_config=dict(grad_clip=None),
                 data=dict(samples_per_gpu=4, workers_per_gpu=0, train=data), runner=dict(type='EpochBasedRunner',
                                                                                           max_epochs=2))
    _, notes = translate(dict(cfg), MMCVTrainer)
    assert "optimizer_config={'grad_clip': None} is not used: the model's train_step steps its several " \
           "optimizers (generator, critic) itself (MMCV's OptimizerHook would fail on a dict of optimizers)" in notes
    trainer = build_trainer(default_args=cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    assert trainer.iter == 4
    assert not any(getattr(h, 'ROLE', None) == 'optimizer' for h in trainer.hooks)
    # one that asks for something (clipping) cannot apply: one line, before anything runs
    cfg = dict(cfg, model=TwoPlayer(), optimizer_config=dict(grad_clip=dict(max_norm=1.0)),
               work_dir=str(tmp_path / 'clip'))
    with pytest.raises(ConfigError, match=r"^optimizer_config \{'grad_clip': \{'max_norm': 1\.0\}\} cannot apply"):
        build_trainer(default_args=cfg)
