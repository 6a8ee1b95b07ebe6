"""``hookloop plot-lr``: the curve it draws is the one training applies, and the PNG is real."""
import pytest
import torch

from hookloop import ConfigError
from hookloop.cli import main
from hookloop.commands.plot_lr import simulate_schedule
from schedule_recording import make_trainer, record

COSINE_WITH_LINEAR_WARMUP = """
custom_imports = ['schedule_recording']
model = dict(type='ScheduleTestRegressor')
train_dataloader = dict(dataset=dict(type='ScheduleTestData', n=1000), batch_size=64, shuffle=True)
optimizer = dict(type='SGD', lr=0.1, momentum=0.9)
max_epochs = 12
lr_config = dict(policy='CosineAnnealing', by_epoch=False, min_lr_ratio=0.01,
                 warmup='linear', warmup_iters=30, warmup_ratio=0.01)
momentum_config = dict(policy='CosineAnnealing', by_epoch=False, min_momentum_ratio=0.85 / 0.95)
"""


def test_plot_lr_writes_a_png_of_the_schedule(tmp_path, capsys):
    config = tmp_path / 'cosine.py'
    config.write_text(COSINE_WITH_LINEAR_WARMUP)
    out = tmp_path / 'plots' / 'lr.png'
    assert main(['plot-lr', str(config), '-o', str(out)]) == 0
    assert out.stat().st_size > 0
    import matplotlib.image
    image = matplotlib.image.imread(str(out))
    assert image.shape == (640, 800, 4)  # two panels (lr, momentum) of 8 x 3.2 inches at 100 dpi
    assert image[..., :3].std() > 0.05  # something is drawn
    # 1000 samples in batches of 64 -> 16 iterations per epoch, 12 epochs
    printed = capsys.readouterr().out
    assert printed.startswith('192 iterations; lr of group 0 from 0.001 to ')
    assert not (tmp_path / 'work_dirs').exists()  # nothing of a run is left behind


def test_plot_lr_of_a_config_without_a_train_loader_is_a_one_line_error(tmp_path, capsys):
    config = tmp_path / 'bad.py'
    config.write_text("model = dict(type='ScheduleTestRegressor')\ncustom_imports = ['schedule_recording']\n"
                      "optimizer = dict(type='SGD', lr=0.1)\n")
    assert main(['plot-lr', str(config), '-o', str(tmp_path / 'x.png')]) == 1
    assert 'plot-lr needs a config with a train_dataloader and an optimizer' in capsys.readouterr().err
    assert not (tmp_path / 'x.png').exists()


@pytest.mark.parametrize('hooks', [
    dict(lr_config=dict(policy='CosineAnnealing', by_epoch=False, min_lr=0.0, warmup='linear', warmup_iters=8)),
    dict(lr_config=dict(policy='Step', step=[2, 4], warmup='exp', warmup_iters=2, warmup_by_epoch=True),
         momentum_config=dict(policy='LinearAnnealing', min_momentum_ratio=0.5)),
    dict(lr_config=dict(policy='OneCycle', max_lr=0.05), momentum_config=dict(policy='OneCycle')),
    dict(lr_config=dict(type='TorchSchedulerHook', scheduler=dict(type='ExponentialLR', gamma=0.9), by_epoch=False)),
])
def test_simulated_schedule_equals_what_training_applies(tmp_path, hooks):
    trained = record(tmp_path / 'trained', **hooks)
    trainer = make_trainer(tmp_path / 'simulated', **hooks)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    lrs, momenta = simulate_schedule(trainer)
    trainer.close()
    assert lrs == trained.lrs
    assert momenta == trained.momenta
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())  # nothing trained


def test_simulate_refuses_a_trainer_without_a_loader(tmp_path):
    from conftest import Regressor
    from hookloop import Trainer
    trainer = Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.1), work_dir=tmp_path, device='cpu', seed=0)
    with pytest.raises(ConfigError, match='needs a config with a train_dataloader'):
        simulate_schedule(trainer)
    trainer.close()
