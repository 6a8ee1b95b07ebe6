"""ModelScope's configuration.json and build_trainer(default_args=dict(cfg_file=..., cfg_modify_fn=...))."""
import json
import os

import pytest

from hookloop import ConfigError, build_trainer
from hookloop.cli import main

import mmcv_style.ms_toy  # noqa: F401  (registers the model and dataset)

CONFIGURATION = {
    'framework': 'pytorch',
    'task': 'text-classification',
    'pipeline': {'type': 'text-classification'},
    'preprocessor': None,
    'model': {'type': 'ToyTextClassifier', 'num_labels': 2},
    'dataset': {'train': {'type': 'ToySequenceClassification', 'split': 'train'},
                'val': {'type': 'ToySequenceClassification', 'split': 'val'}},
    'train': {
        'work_dir': 'WORK',
        'max_epochs': 3,
        'dataloader': {'batch_size_per_gpu': 8, 'workers_per_gpu': 0},
        'optimizer': {'type': 'SGD', 'lr': 0.1, 'momentum': 0.9,
                      'options': {'grad_clip': {'max_norm': 5.0, 'norm_type': 2}, 'cumulative_iters': 1}},
        'lr_scheduler': {'type': 'StepLR', 'step_size': 5, 'gamma': 0.5,
                         'options': {'warmup': {'type': 'LinearWarmup', 'warmup_iters': 2, 'warmup_ratio': 0.5},
                                     'by_epoch': False}},
        'hooks': [{'type': 'CheckpointHook', 'interval': 1, 'max_checkpoint_num': 2},
                  {'type': 'BestCkptSaverHook', 'metric_key': 'accuracy', 'rule': 'max'},
                  {'type': 'TextLoggerHook', 'interval': 1},
                  {'type': 'IterTimerHook'},
                  {'type': 'LrSchedulerHook'},
                  {'type': 'OptimizerHook'},
                  {'type': 'EvaluationHook', 'interval': 1}],
    },
    'evaluation': {'dataloader': {'batch_size_per_gpu': 16, 'workers_per_gpu': 0, 'shuffle': False},
                   'metrics': ['accuracy']},
}


def write(tmp_path, configuration=CONFIGURATION):
    configuration = json.loads(json.dumps(configuration).replace('WORK', str(tmp_path / 'work')))
    path = tmp_path / 'configuration.json'
    path.write_text(json.dumps(configuration, indent=2))
    return str(path)


def records(work_dir):
    [name] = [n for n in os.listdir(work_dir) if n.endswith('.log.json')]
    with open(os.path.join(work_dir, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_configuration_json_trains_from_cli(tmp_path):
    path = write(tmp_path)
    assert main(['train', path, '--cfg-options', 'seed=0', 'device="cpu"']) == 0
    work_dir = str(tmp_path / 'work')
    names = os.listdir(work_dir)
    assert sorted(n for n in names if n.startswith('epoch_') and n.endswith('.pth')) == ['epoch_2.pth', 'epoch_3.pth']  # max_checkpoint_num
    assert any(n.startswith('best_epoch') and '_accuracy' in n for n in names)  # ModelScope's best file name
    logged = records(work_dir)
    train = [r for r in logged if r.get('mode') == 'train']
    # LinearWarmup over 2 scheduler steps (ratio 0.5) on StepLR(step_size=5, gamma=0.5), by iteration;
    # ModelScope steps at the end of each iteration, before its logger: iteration i logs the LR after i steps
    expected = [0.075, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.025, 0.0125]
    assert [r['lr'] for r in train] == pytest.approx(expected)
    assert all('grad_norm' in r for r in train)  # options.grad_clip reached the optimizer hook
    val = [r for r in logged if r.get('mode') == 'eval']  # ModelScope's mode name
    assert len(val) == 3 and all(0 <= r['accuracy'] <= 1 for r in val)  # ModelScope's accuracy: a fraction


def test_build_trainer_with_cfg_file_and_cfg_modify_fn(tmp_path):
    path = write(tmp_path)

    def cfg_modify_fn(cfg):
        cfg.train.max_epochs = 1
        cfg.train.optimizer.lr = 0.01
        return cfg

    model = mmcv_style.ms_toy.ToyTextClassifier(hidden=4)
    trainer = build_trainer('trainer', default_args=dict(cfg_file=path, cfg_modify_fn=cfg_modify_fn, model=model,
                                                         work_dir=str(tmp_path / 'other'), seed=0, device='cpu'))
    try:
        assert trainer.model is model and trainer.max_epochs == 1
        assert trainer.optimizer.defaults['lr'] == 0.01
        trainer.train()
        assert os.path.exists(str(tmp_path / 'other' / 'epoch_1.pth'))
    finally:
        trainer.close()


@pytest.mark.parametrize('edit,named', [
    (dict(preprocessor={'type': 'sen-cls-tokenizer'}), ['preprocessor']),
    (dict(model='damo/nlp_structbert_sentence-similarity_chinese-base',
          preprocessor={'type': 'sen-cls-tokenizer'}), ['hub model id', 'preprocessor']),
    (dict(dataset={'train': {'name': 'clue', 'subset_name': 'afqmc'}}), ['dataset.train']),
])
def test_unsupported_pieces_are_named_in_one_line(tmp_path, capsys, edit, named):
    path = write(tmp_path, {**CONFIGURATION, **edit})
    assert main(['train', path]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'not supported' in err
    assert all(piece in err for piece in named), err
    assert not os.path.exists(str(tmp_path / 'work'))


def test_build_trainer_refuses_a_hub_model_id(tmp_path):
    with pytest.raises(ConfigError, match='hub model id'):
        build_trainer('EpochBasedTrainer', default_args=dict(cfg_file=write(tmp_path), model='damo/some-model'))
