"""An MMCV config with ``data.val`` and no ``evaluation`` key validates as the OpenMMLab train
scripts do, ``EvalHook(**cfg.get('evaluation', {}))``: the val dataset's ``evaluate`` and its
metrics in the log, per epoch, or per iteration for an IterBasedRunner (issue 39 item 4)."""
import json
import os

import pytest

import mmcv_style.toy  # noqa: F401 (registers ToyClassifier, ToyImageDataset)
from hookloop.compat.build import build_trainer

TOY = dict(type='ToyImageDataset', data_root='', pipeline=[], size=8)


def run(tmp_path, runner, **extra):
    cfg = dict(model=dict(type='ToyClassifier', backbone=dict(width=4), head=dict(num_classes=2)),
               optimizer=dict(type='SGD', lr=0.1), runner=runner, seed=0, device='cpu', work_dir=str(tmp_path / 'run'),
               data=dict(samples_per_gpu=4, workers_per_gpu=0, train=TOY, val=dict(TOY, split='val')),
               log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook')]), **extra)
    trainer = build_trainer(default_args=cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def val_records(trainer):
    [name] = [n for n in os.listdir(trainer.work_dir) if n.endswith('.log.json')]
    with open(os.path.join(trainer.work_dir, name)) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if r.get('mode') == 'val']


@pytest.mark.parametrize('runner, evaluations', [(dict(type='EpochBasedRunner', max_epochs=2), 2),
                                                 (dict(type='IterBasedRunner', max_iters=3), 3)])
def test_data_val_without_evaluation_key_evaluates_the_dataset(tmp_path, runner, evaluations):
    trainer = run(tmp_path, runner)
    # EvalHook's defaults: interval 1 (epochs; iterations for IterBasedRunner), every val sample
    assert trainer.val_evaluator.dataset.evaluated == [8] * evaluations
    records = val_records(trainer)
    assert len(records) == evaluations and all('accuracy' in r for r in records)


def test_evaluation_key_with_hook_options_only_still_evaluates_the_dataset(tmp_path):
    trainer = run(tmp_path, dict(type='EpochBasedRunner', max_epochs=2), evaluation=dict(interval=2))
    assert trainer.val_evaluator.dataset.evaluated == [8]
    assert [r['epoch'] for r in val_records(trainer)] == [2]
