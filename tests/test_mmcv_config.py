"""MMCV 1.x configs, written here as mmdet/mmseg/mmcls 0.x/2.x ship them, load unchanged as
``_base_`` and train from the CLI."""
import json
import os

import pytest
import torch

from hookloop.cli import main
from hookloop.config.loader import load_config, parse_options, set_dotted

RUNTIME = """
checkpoint_config = dict(interval=1)
log_config = dict(interval=2, hooks=[dict(type='TextLoggerHook')])
custom_imports = dict(imports=['mmcv_style.toy'], allow_failed_imports=False)
dist_params = dict(backend='nccl')
log_level = 'INFO'
load_from = None
resume_from = None
workflow = [('train', 1)]
opencv_num_threads = 0
mp_start_method = 'fork'
cudnn_benchmark = False
auto_scale_lr = dict(enable=False, base_batch_size=16)
gpu_ids = [0]
"""

SCHEDULE = """
optimizer = dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=0.0001,
                 paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
optimizer_config = dict(grad_clip=None)
lr_config = dict(policy='step', warmup='linear', warmup_iters=2, warmup_ratio=0.001, step=[2])
runner = dict(type='EpochBasedRunner', max_epochs=3)
"""

DATASET = """
dataset_type = 'ToyImageDataset'
data_root = 'data/toy/'
img_norm_cfg = dict(mean=[0.0], std=[1.0], to_rgb=True)
train_pipeline = [dict(type='LoadImageFromFile'), dict(type='Normalize', **img_norm_cfg)]
test_pipeline = [dict(type='LoadImageFromFile')]
data = dict(
    samples_per_gpu=8,
    workers_per_gpu=0,
    train=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline, mean=img_norm_cfg['mean']),
    val=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline, split='val', samples_per_gpu=16),
    test=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline, split='val'))
evaluation = dict(interval=1, metric='accuracy', topk=1, save_best='auto')
"""

MODEL = """
_base_ = ['_base_/runtime.py', '_base_/schedule.py', '_base_/dataset.py']
model = dict(type='ToyClassifier', backbone=dict(width=8), head=dict(num_classes=2))
seed = 0
device = 'cpu'
"""


def write_configs(tmp_path, model=MODEL, schedule=SCHEDULE, runtime=RUNTIME, dataset=DATASET):
    base = tmp_path / '_base_'
    base.mkdir(exist_ok=True)
    (base / 'runtime.py').write_text(runtime)
    (base / 'schedule.py').write_text(schedule)
    (base / 'dataset.py').write_text(dataset)
    (tmp_path / 'model.py').write_text(model)
    return str(tmp_path / 'model.py')


def log_records(work_dir):
    [name] = [n for n in os.listdir(work_dir) if n.endswith('.log.json')]
    with open(os.path.join(work_dir, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def text_log(work_dir):
    [name] = [n for n in os.listdir(work_dir) if n.endswith('.log')]
    with open(os.path.join(work_dir, name)) as f:
        return f.read()


@pytest.mark.slow
def test_mmcv_epoch_config_with_bases_trains_from_cli(tmp_path):
    cfg = write_configs(tmp_path, dataset=DATASET + "\nfp16 = dict(loss_scale=512.)\n")
    work_dir = str(tmp_path / 'run')
    assert main(['train', cfg, '--work-dir', work_dir]) == 0
    assert sorted(n for n in os.listdir(work_dir) if n.startswith('epoch_') and n.endswith('.pth')) == ['epoch_1.pth', 'epoch_2.pth',
                                                                                 'epoch_3.pth']
    records = log_records(work_dir)
    train = [r for r in records if r.get('mode') == 'train']
    # every loss term is logged and their sum is the loss (MMCV's _parse_losses)
    assert {'loss_cls', 'loss_aux', 'loss'} <= set(train[0])
    assert train[0]['loss'] == pytest.approx(train[0]['loss_cls'] + train[0]['loss_aux'], rel=1e-5)
    assert train[0]['loss_scale'] == 512.0  # fp16=dict(loss_scale=512.) turned on the static scaler
    val = [r for r in records if r.get('mode') == 'val']
    assert len(val) == 3 and all(0 <= r['accuracy'] <= 100 for r in val)  # dataset.evaluate(metric='accuracy')
    assert any(n.startswith('best_accuracy') for n in os.listdir(work_dir))
    log = text_log(work_dir)
    helper_line = [line for line in log.splitlines() if 'helper variables' in line]
    assert len(helper_line) == 1
    for name in ('dataset_type', 'data_root', 'img_norm_cfg', 'train_pipeline', 'test_pipeline'):
        assert name in helper_line[0]
    checkpoint = torch.load(os.path.join(work_dir, 'epoch_3.pth'), weights_only=True)
    # paramwise_cfg: the BatchNorm weight and the biases have no weight decay, the linear weights do
    decays = [g['weight_decay'] for g in checkpoint['optimizer']['param_groups']]
    assert decays == [0.0001, 0.0, 0.0, 0.0, 0.0001, 0.0]
    # step policy after linear warm-up: epoch 3 runs at lr * 0.1
    assert checkpoint['optimizer']['param_groups'][0]['lr'] == pytest.approx(0.01)


def test_runner_max_epochs_from_cfg_options(tmp_path):
    cfg = write_configs(tmp_path)
    work_dir = str(tmp_path / 'run')
    assert main(['train', cfg, '--work-dir', work_dir, '--cfg-options', 'runner.max_epochs=1',
                 'evaluation.interval=5']) == 0
    assert sorted(n for n in os.listdir(work_dir) if n.startswith('epoch_') and n.endswith('.pth')) == ['epoch_1.pth']


ITER_SCHEDULE = """
optimizer = dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0005)
optimizer_config = dict()
lr_config = dict(policy='poly', power=0.9, min_lr=1e-4, by_epoch=False)
runner = dict(type='IterBasedRunner', max_iters=10)
checkpoint_config = dict(by_epoch=False, interval=5)
evaluation = dict(interval=5, metric='accuracy')
"""


def test_iter_based_runner_with_poly_lr(tmp_path):
    cfg = write_configs(tmp_path, schedule=ITER_SCHEDULE,
                        runtime=RUNTIME.replace("interval=2, hooks=[dict(type='TextLoggerHook')]",
                                                "interval=1, hooks=[dict(type='TextLoggerHook', by_epoch=False)]"),
                        dataset=DATASET.split('evaluation =')[0])
    work_dir = str(tmp_path / 'run')
    assert main(['train', cfg, '--work-dir', work_dir]) == 0
    assert sorted(n for n in os.listdir(work_dir) if n.startswith('iter_') and n.endswith('.pth')) == ['iter_10.pth', 'iter_5.pth']
    records = [r for r in log_records(work_dir) if r.get('mode') == 'train']
    lrs = [r['lr'] for r in records]
    expected = [(0.01 - 1e-4) * (1 - i / 10) ** 0.9 + 1e-4 for i in range(10)]  # MMCV's poly rule, per iter
    assert lrs == pytest.approx(expected, rel=1e-6)
    assert len([r for r in log_records(work_dir) if r.get('mode') == 'val']) == 2  # by_epoch=False under iters


def test_several_bad_keys_are_reported_in_one_error(tmp_path, capsys):
    model = MODEL + """
lr_confg = dict(policy='step', step=[1])
max_epoch = 3
data_rot = 'x'
fp16 = 512
"""
    cfg = write_configs(tmp_path, model=model, schedule=SCHEDULE.replace(
        "dict(type='EpochBasedRunner', max_epochs=3)", "dict(type='DynamicRunner', max_epochs=3)"))
    assert main(['train', cfg, '--work-dir', str(tmp_path / 'run')]) == 1
    err = capsys.readouterr().err
    assert 'the config has 4 problems' in err
    assert "'lr_confg'; did you mean 'lr_config'?" in err
    assert "'max_epoch'; did you mean 'max_epochs'?" in err
    assert 'fp16 must be a dict' in err
    assert 'data_rot' not in err  # far from every key: a helper name, not an error
    assert "runner type 'DynamicRunner' is not supported" in err
    assert not os.path.exists(str(tmp_path / 'run' / 'epoch_1.pth'))


def test_workflow_val_runs_validation_and_total_epochs_sets_the_length(tmp_path):
    schedule = SCHEDULE.replace("runner = dict(type='EpochBasedRunner', max_epochs=3)", 'total_epochs = 2')
    runtime = RUNTIME.replace("workflow = [('train', 1)]", "workflow = [('train', 1), ('val', 1)]")
    dataset = DATASET.split('evaluation =')[0]
    cfg = write_configs(tmp_path, schedule=schedule, runtime=runtime, dataset=dataset)
    work_dir = str(tmp_path / 'run')
    assert main(['train', cfg, '--work-dir', work_dir]) == 0
    assert sorted(n for n in os.listdir(work_dir) if n.startswith('epoch_') and n.endswith('.pth')) == ['epoch_1.pth', 'epoch_2.pth']
    assert 'val' in text_log(work_dir).lower()


def test_auto_scale_lr_scales_like_mmdet(tmp_path):
    runtime = RUNTIME.replace('enable=False', 'enable=True')
    cfg = load_config(write_configs(tmp_path, runtime=runtime))
    from hookloop.compat.mmcv_config import translate
    from hookloop.engine.trainer import Trainer
    kwargs, notes = translate(cfg, Trainer)
    assert kwargs['optimizer']['lr'] == pytest.approx(0.1 * 8 / 16)  # 1 GPU x 8 samples vs base 16
    assert kwargs['train_dataloader']['batch_size'] == 8 and kwargs['val_dataloader']['batch_size'] == 16
    assert kwargs['max_epochs'] == 3 and 'dist_backend' not in kwargs  # nccl without CUDA: gloo
    assert any('auto_scale_lr' in n for n in notes)


def test_cfg_options_reach_runner_dict(tmp_path):
    cfg = load_config(write_configs(tmp_path))
    for dotted, value in parse_options(['runner.max_epochs=1']).items():
        set_dotted(cfg, dotted, value)
    assert cfg['runner'] == {'type': 'EpochBasedRunner', 'max_epochs': 1}


def test_build_trainer_takes_mmcv_keys(tmp_path):
    from conftest import Regressor, regression_data

    from hookloop import ConfigError, build_trainer
    trainer = build_trainer(default_args=dict(
        model=Regressor(), optimizer=dict(type='SGD', lr=0.05), work_dir=str(tmp_path), seed=0,
        device='cpu', runner=dict(type='EpochBasedRunner', max_epochs=2), workflow=[('train', 1)],
        data=dict(samples_per_gpu=8, workers_per_gpu=0, train=regression_data(32)),
        dist_params=dict(backend='gloo'), img_norm_cfg=dict(mean=[0.0])))
    try:
        assert trainer.max_epochs == 2 and trainer.iters_per_epoch == 4  # 32 samples, samples_per_gpu=8
        trainer.train()
        assert trainer.iter == 8
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match=r"the config has 2 problems:[\s\S]*'lr_confg'[\s\S]*'runer'"):
        build_trainer(default_args=dict(model=Regressor(), lr_confg=dict(policy='step', step=[1]),
                                        runer=dict(max_epochs=1)))


def test_trainer_refuses_mmcv_keys_and_names_build_trainer(tmp_path):
    from conftest import Regressor

    from hookloop import ConfigError, Trainer
    with pytest.raises(ConfigError, match=r'runner=, data=: MMCV 1\.x config[\s\S]*build_trainer\(default_args=cfg\)'):
        Trainer(Regressor(), work_dir=str(tmp_path), runner=dict(type='EpochBasedRunner', max_epochs=1), data={})
    with pytest.raises(ConfigError, match=r"2 problems:[\s\S]*'lr_confg'; did you mean 'lr_config'[\s\S]*'runer'; "
                                          r"did you mean 'runner'"):
        Trainer(Regressor(), work_dir=str(tmp_path), lr_confg={}, runer={})
    assert not os.listdir(tmp_path)  # refused before anything is created
