"""MMCV 1.x conformance of the config translation and the ``hookloop.compat.mmcv`` façade
(issue 25): each test states what MMCV 1.7 does and checks hookloop does the same."""
import logging
import os

import pytest
import torch
from conftest import Regressor, regression_data

from hookloop import ConfigError, Hook, Trainer
from hookloop.cli import main
from hookloop.config.loader import load_config
from hookloop.compat.build import build_trainer


class LrRecorder(Hook):
    """The learning rate each iteration ran at (read after the step)."""

    PRIORITY = 'LOWEST'

    def __init__(self):
        self.lrs = []

    def after_train_iter(self, trainer):
        self.lrs.append(trainer.optimizer.param_groups[0]['lr'])


def iter_trainer(tmp_path, **cfg):
    args = dict(model=Regressor(), optimizer=dict(type='SGD', lr=0.1), work_dir=str(tmp_path / 'run'), seed=0,
                device='cpu', data=dict(samples_per_gpu=4, workers_per_gpu=0, train=regression_data(16)))
    args.update(cfg)
    return build_trainer(default_args=args)


def run(trainer, *hooks):
    for hook in hooks:
        trainer.register_hook(hook)
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


# -- finding 1: IterBasedRunner gives the schedule, checkpoint and logger hooks by_epoch=False
def test_iter_based_runner_config_steps_lr_and_saves_per_iteration(tmp_path):
    recorder = LrRecorder()
    trainer = iter_trainer(tmp_path, runner=dict(type='IterBasedRunner', max_iters=20),
                           lr_config=dict(policy='step', step=[15]), checkpoint_config=dict(interval=10),
                           log_config=dict(interval=5, hooks=[dict(type='TextLoggerHook')]))
    run(trainer, recorder)
    # MMCV: step counts iterations under IterBasedRunner: 0.1 for iterations 0..14, then 0.01
    assert recorder.lrs[:15] == pytest.approx([0.1] * 15) and recorder.lrs[15:] == pytest.approx([0.01] * 5)
    saved = sorted(n for n in os.listdir(tmp_path / 'run') if n.endswith('.pth') and n[0] in 'ei')
    assert saved == ['iter_10.pth', 'iter_20.pth']
    [logger] = [h for h in trainer.hooks if type(h).__name__ == 'TextLoggerHook']
    assert logger.by_epoch is False


def test_iter_based_runner_adapter_registers_per_iteration_hooks(tmp_path):
    from hookloop.compat.mmcv import IterBasedRunner
    recorder = LrRecorder()
    model = Regressor()
    runner = IterBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             work_dir=str(tmp_path / 'run'), logger=logging.getLogger('test'), max_iters=30)
    runner.register_training_hooks(lr_config=dict(policy='step', step=[15]), optimizer_config=dict(),
                                   checkpoint_config=dict(interval=10), log_config=dict(interval=5))
    runner.register_hook(recorder)
    loader = torch.utils.data.DataLoader(regression_data(12), batch_size=4)
    try:
        runner.run([loader], [('train', 1)])
    finally:
        runner.trainer.close()
    assert recorder.lrs[14] == pytest.approx(0.1) and recorder.lrs[15] == pytest.approx(0.01)
    saved = sorted(n for n in os.listdir(tmp_path / 'run') if n.startswith(('iter_', 'epoch_')) and n.endswith('.pth'))
    assert saved == ['iter_10.pth', 'iter_20.pth', 'iter_30.pth']


# -- finding 4: a helper named ``train`` (mmocr) does not make the file a ModelScope config
def test_mmocr_helper_named_train_is_an_mmcv_helper(tmp_path):
    trainer = iter_trainer(tmp_path, runner=dict(type='EpochBasedRunner', max_epochs=1),
                           train=dict(type='OCRDataset', ann_file='x.txt', pipeline=None),
                           optimizer_config=dict(grad_clip=None))
    run(trainer)
    assert trainer.iter == 4  # 16 samples, samples_per_gpu=4: MMCV's data= loader, one epoch


# -- finding 5: {{_base_.xxx}}
def test_base_references_take_the_bases_values(tmp_path):
    (tmp_path / 'base.py').write_text("dataset_info = dict(name='coco', joints=17)\n"
                                      "train_pipeline = [dict(type='Load'), dict(type='Flip', p=0.5)]\n"
                                      "model = dict(backbone=dict(depth=50))\n")
    (tmp_path / 'cfg.py').write_text("_base_ = ['base.py']\n"
                                     "dataset_info = {{_base_.dataset_info}}\n"
                                     "pipeline = {{ _base_.train_pipeline }} + [dict(type='Collect')]\n"
                                     "depth = {{_base_.model.backbone.depth}} + 1\n")
    cfg = load_config(tmp_path / 'cfg.py')
    assert cfg['dataset_info'] == {'name': 'coco', 'joints': 17}
    assert [p['type'] for p in cfg['pipeline']] == ['Load', 'Flip', 'Collect']
    assert cfg['depth'] == 51 and cfg['model'] == {'backbone': {'depth': 50}}
    (tmp_path / 'bad.py').write_text("_base_ = 'base.py'\nx = {{_base_.missing}}\n")
    with pytest.raises(ConfigError, match=r'_base_\.missing.*not in its _base_'):
        load_config(tmp_path / 'bad.py')


# -- finding 7: evaluation.dynamic_intervals changes the interval (mmdet YOLOX)
def test_dynamic_intervals_change_the_evaluation_interval(tmp_path):
    from hookloop.hooks import EvaluationHook
    hook = EvaluationHook(interval=3, dynamic_intervals=[(7, 1)])
    # mmdet: evaluate after epochs 3 and 6, then every epoch from 7 done on
    assert [n for n in range(1, 11) if hook._due(n, n == 10)] == [3, 6, 7, 8, 9, 10]
    import mmcv_style.toy  # noqa: F401 (registers ToyClassifier, ToyImageDataset)
    toy = dict(type='ToyImageDataset', data_root='', pipeline=[], size=8)
    trainer = iter_trainer(tmp_path, model=dict(type='ToyClassifier', backbone=dict(width=4), head=dict(num_classes=2)),
                           runner=dict(type='EpochBasedRunner', max_epochs=4),
                           data=dict(samples_per_gpu=4, workers_per_gpu=0, train=toy, val=dict(toy, split='val')),
                           evaluation=dict(interval=3, metric='accuracy', dynamic_intervals=[(3, 1)]))
    run(trainer)
    calls = trainer.val_evaluator.dataset.evaluated
    assert calls == [8, 8]  # after epochs 3 and 4; the option is not passed to evaluate


# -- finding 9: spellings of other OpenMMLab repos
def test_helper_max_epochs_gives_way_to_runner_cfg_options(tmp_path):
    (tmp_path / 'yolox.py').write_text(
        "max_epochs = 300\nrunner = dict(type='EpochBasedRunner', max_epochs=max_epochs)\n"
        "model = dict(type='Regressor')\noptimizer = dict(type='SGD', lr=0.1)\n")
    from hookloop.cli import load_with_options
    from hookloop.compat.mmcv_config import translate
    from hookloop.registry import MODELS
    MODELS.register_module(module=Regressor, force=True)  # translate checks the config's types
    cfg = load_with_options(str(tmp_path / 'yolox.py'), ['runner.max_epochs=2'])
    kwargs, notes = translate(cfg, Trainer)
    assert kwargs['max_epochs'] == 2 and any('max_epochs=300 is a helper variable' in n for n in notes)


def test_other_repos_spellings(tmp_path):
    from hookloop.compat.mmcv_config import translate
    data = dict(videos_per_gpu=4, workers_per_gpu=0, train=regression_data(16),
                val_dataloader=dict(videos_per_gpu=2), val=regression_data(8))
    kwargs, _ = translate(dict(model=Regressor(), data=data, total_iters=7,
                               optimizers=dict(type='SGD', lr=0.1)), Trainer)
    assert kwargs['train_dataloader']['batch_size'] == 4 and kwargs['val_dataloader']['batch_size'] == 2
    assert kwargs['max_iters'] == 7 and 'max_epochs' not in kwargs  # mmediting's total_iters: iterations
    # MMCV's train scripts build a plain optimizer dict with DefaultOptimizerConstructor (all parameters)
    assert kwargs['optimizer'] == dict(type='SGD', lr=0.1, constructor='DefaultOptimizerConstructor')
    kwargs, _ = translate(dict(model=Regressor(), runner=dict(type='DynamicIterBasedRunner', max_iters=5,
                                                              is_dynamic_ddp=True, pass_training_status=True),
                               checkpoint_config=dict(interval=2)), Trainer)
    assert kwargs['max_iters'] == 5 and kwargs['checkpoint_config'] == dict(interval=2, by_epoch=False)
    # step=[] (no decay): a constant LR, as MMCV's StepLrUpdaterHook
    recorder = LrRecorder()
    run(iter_trainer(tmp_path, total_epochs=2, lr_config=dict(policy='step', step=[])), recorder)
    assert recorder.lrs == pytest.approx([0.1] * 8)


# -- issue 20 item 9: a top-level optimizer argument is not silently a helper
def test_top_level_lr_is_an_error_with_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match=r"lr = 0\.1 at the top.*did you mean optimizer=dict\(\.\.\., lr=0\.1\)"):
        iter_trainer(tmp_path, total_epochs=1, lr=0.1, optimizer=dict(type='SGD', lr=0.02))
    # a helper the optimizer uses is fine
    trainer = iter_trainer(tmp_path, total_epochs=1, lr=0.02, optimizer=dict(type='SGD', lr=0.02))
    trainer.close()


# -- finding 11: save_best rules as MMCV's EvalHook, and the config's keys
def test_save_best_rules_follow_mmcv_and_the_configs_keys():
    from hookloop.checkpoint.best import infer_rule
    from hookloop.hooks import EvaluationHook
    assert EvaluationHook(save_best='AP').best.rule == 'greater'  # mmpose's key
    assert EvaluationHook(save_best='AR@100').best.rule == 'greater'
    assert EvaluationHook(save_best='PCKh', greater_keys=['pckh']).best.rule == 'greater'
    assert EvaluationHook(save_best='EPE', less_keys=['epe']).best.rule == 'less'
    # MMCV: the given lists replace the defaults, exact names first, greater before less
    assert infer_rule('loss_acc', greater_keys=['acc']) == 'greater'
    assert infer_rule('NME', greater_keys=['acc'], less_keys=['NME']) == 'less'
    assert infer_rule('mAP', greater_keys=['pck']) is None
    with pytest.raises(ConfigError, match='cannot tell'):
        EvaluationHook(save_best='mAP', greater_keys=['pck'])


# -- finding 3: constructor subclasses take their own paramwise_cfg keys
def test_optimizer_constructor_subclass_takes_its_own_paramwise_keys():
    from hookloop.errors import ConfigTypeError
    from hookloop.optim.constructor import OPTIMIZER_CONSTRUCTORS, DefaultOptimizerConstructor, build_optimizer

    @OPTIMIZER_CONSTRUCTORS.register_module(force=True)
    class LayerDecayConstructor(DefaultOptimizerConstructor):  # as mmseg's layer-decay constructors
        def add_params(self, params, module, prefix=''):
            rate, layers = self.paramwise_cfg['decay_rate'], self.paramwise_cfg['num_layers']
            for depth, (name, param) in enumerate(module.named_parameters()):
                params.append({'params': [param], 'lr': self.base_lr * rate ** (layers - min(depth, layers))})

    model = Regressor()
    optimizer = build_optimizer(model, dict(type='SGD', lr=1.0, constructor='LayerDecayConstructor',
                                            paramwise_cfg=dict(decay_rate=0.5, num_layers=2)))
    assert [g['lr'] for g in optimizer.param_groups] == [0.25, 0.5, 1.0, 1.0]
    with pytest.raises(ConfigError, match='unknown keys'):  # the base's rules: still checked
        build_optimizer(model, dict(type='SGD', lr=1.0, paramwise_cfg=dict(decay_rate=0.5)))
    with pytest.raises(TypeError, match='paramwise_cfg must be None or a dict'):  # MMCV: TypeError
        build_optimizer(model, dict(type='SGD', lr=1.0, paramwise_cfg=[('bias_lr_mult', 2)]))
    with pytest.raises(ConfigTypeError):
        DefaultOptimizerConstructor(dict(type='SGD', lr=1.0), paramwise_cfg='x')


# -- finding 6: what hooks read on the runner
def test_hooks_find_mmcv_runner_attributes(tmp_path):
    seen = {}

    class NumClassCheck(Hook):  # as mmdet's NumClassCheckHook and logger hooks read the runner
        def before_train_epoch(self, runner):
            seen['loader'] = runner.data_loader
            seen['model_name'] = runner.model_name
            runner.log_buffer.update({'extra': 2.0})

        def after_train_iter(self, runner):
            seen['outputs'] = runner.outputs
            seen['lr'] = runner.current_lr()

        def before_val_epoch(self, runner):
            seen['val_loader'] = runner.data_loader

        def after_train_epoch(self, runner):
            seen['output'] = dict(runner.log_buffer.output)
            seen['meta'] = runner.meta

    trainer = iter_trainer(tmp_path, total_epochs=1, data=dict(samples_per_gpu=4, workers_per_gpu=0,
                                                               train=regression_data(8), val=regression_data(4)))
    run(trainer, NumClassCheck())
    assert seen['loader'] is trainer.train_dataloader and seen['val_loader'] is trainer.val_dataloader
    assert seen['model_name'] == 'Regressor' and seen['lr'] == [0.1] and 'loss' in seen['outputs']
    assert seen['output']['extra'] == 2.0 and seen['meta'] is None
    assert callable(trainer.call_hook) and callable(trainer.register_checkpoint_hook)
    hook = NumClassCheck()
    assert hook.get_triggered_stages() == ['before_train_epoch', 'after_train_iter', 'after_train_epoch',
                                           'before_val_epoch']


def test_runner_meta_gets_hook_messages_and_the_runner_checks_like_mmcv(tmp_path):
    from hookloop.compat.mmcv import EpochBasedRunner
    model = Regressor()
    with pytest.raises(TypeError):  # MMCV: logger must be a logging.Logger
        EpochBasedRunner(model, work_dir=str(tmp_path))
    with pytest.raises(TypeError):
        EpochBasedRunner(model, optimizer='sgd', logger=logging.getLogger())
    with pytest.raises(TypeError):
        EpochBasedRunner(model, logger=logging.getLogger(), meta=['list'])
    with pytest.raises(ValueError, match='Only one of'):
        EpochBasedRunner(model, logger=logging.getLogger(), max_epochs=1, max_iters=1)
    with pytest.raises(AssertionError):  # neither train_step nor a forward
        EpochBasedRunner(torch.nn.Linear(2, 2).__class__.__bases__[0](), logger=logging.getLogger())
    runner = EpochBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              work_dir=str(tmp_path), logger=logging.getLogger('t'), meta=dict(), max_epochs=1)
    runner.register_checkpoint_hook(dict(interval=1))
    try:
        runner.run([torch.utils.data.DataLoader(regression_data(8), batch_size=4)], [('train', 1)])
    finally:
        runner.trainer.close()
    assert runner.meta['hook_msgs']['last_ckpt'] == os.path.join(str(tmp_path), 'epoch_1.pth')
    with pytest.raises(TypeError):
        runner.save_checkpoint(str(tmp_path), meta='str')


# -- finding 8: names MMCV code imports
def test_mmcv_names_import():
    import hookloop.compat.mmcv as runner
    from hookloop.compat.mmcv.fp16_utils import cast_tensor_type
    from hookloop.compat.mmcv.hooks import IterTimerHook  # noqa: F401
    from hookloop.compat.mmcv.hooks.hook import HOOKS
    from hookloop.compat.mmcv.hooks.lr_updater import CosineRestartLrUpdaterHook, annealing_cos  # noqa: F401
    for name in ('is_module_wrapper', 'annealing_cos', 'OPTIMIZER_BUILDERS', 'SyncBatchNorm', '_BatchNorm', '_ConvNd',
                 'PaviLoggerHook', 'ClearMLLoggerHook', 'SegmindLoggerHook'):
        assert hasattr(runner, name), name
    assert runner.is_module_wrapper(torch.nn.DataParallel(Regressor())) and not runner.is_module_wrapper(Regressor())
    assert annealing_cos(1.0, 0.0, 0.5) == pytest.approx(0.5)
    assert HOOKS.module_dict['IterTimerHook'] is IterTimerHook
    assert cast_tensor_type(torch.ones(1), torch.float32, torch.int32).dtype == torch.int32
    built = runner.RUNNERS.build(dict(type='EpochBasedRunner', max_epochs=1),
                                 default_args=dict(model=Regressor(), logger=logging.getLogger('t'),
                                                   work_dir=None))
    assert built._max_epochs == 1
    built.trainer.close()
    assert set(runner.RUNNERS.module_dict) == {'EpochBasedRunner', 'IterBasedRunner'}


# -- finding 10: checkpoints keep what MMCV keeps
def test_checkpoints_keep_metadata_classes_and_tuples(tmp_path):
    from hookloop.checkpoint.format import load_checkpoint as load_file
    from hookloop.compat.mmcv import load_checkpoint, save_checkpoint

    class Detector(torch.nn.Module):
        CLASSES = ('cat', 'dog')

        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(2)

    path = str(tmp_path / 'det.pth')
    save_checkpoint(Detector(), path, meta=dict(shape=(3, 4)))
    meta = load_file(path)['meta']
    assert meta['CLASSES'] == ('cat', 'dog') and meta['shape'] == (3, 4)  # tuples stay tuples
    with pytest.raises(TypeError):
        save_checkpoint(Detector(), path, meta='str')
    versions = []

    class Versioned(Detector):
        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
            versions.append(local_metadata.get('version'))
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    wrapped = {'state_dict': Detector().state_dict()}
    wrapped['state_dict'] = type(wrapped['state_dict'])(('module.' + k, v) for k, v in wrapped['state_dict'].items())
    wrapped['state_dict']._metadata = type(wrapped['state_dict'])(
        ('module' + ('.' + k if k else ''), v) for k, v in Detector().state_dict()._metadata.items())
    torch.save(wrapped, str(tmp_path / 'wrapped.pth'))
    load_checkpoint(Versioned(), str(tmp_path / 'wrapped.pth'))  # default revise_keys strips 'module.'
    assert versions[0] == Versioned._version  # a current checkpoint is not taken for an old one
    trainer = iter_trainer(tmp_path, total_epochs=1, model=Versioned())
    versions.clear()
    trainer.load_weights(str(tmp_path / 'wrapped.pth'), strict=False, revise_keys=[(r'^module\.', '')])
    trainer.close()
    assert versions[0] == Versioned._version
    assert 'CLASSES' in trainer.state_dict()['meta']


class StepModel(torch.nn.Module):
    """MMCV's demo model: train_step returns the loss and nothing to log."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.linear(x)

    def train_step(self, x, optimizer, **kwargs):
        return dict(loss=self(x).sum())

    def val_step(self, x, optimizer, **kwargs):
        return dict(loss=self(x).sum())


def demo_runner(tmp_path, kind='EpochBasedRunner', **lengths):
    from hookloop.compat.mmcv import build_runner
    model = StepModel()
    return build_runner(dict(type=kind, **lengths), default_args=dict(
        model=model, work_dir=str(tmp_path), logger=logging.getLogger('t'),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.95)))


def test_mmcv_tracker_hooks_log_mmcv_tags_and_steps(tmp_path, monkeypatch):
    import sys
    from unittest.mock import MagicMock

    from hookloop.compat.mmcv import PaviLoggerHook, WandbLoggerHook
    monkeypatch.setitem(sys.modules, 'wandb', MagicMock())
    monkeypatch.setitem(sys.modules, 'pavi', MagicMock())
    runner = demo_runner(tmp_path, max_epochs=1)
    wandb, pavi = WandbLoggerHook(), PaviLoggerHook(interval=1)
    runner.register_hook(wandb)
    runner.register_hook(pavi)
    loader = torch.utils.data.DataLoader(torch.ones(5, 2))
    try:
        runner.run([loader, loader], [('train', 1), ('val', 1)])
    finally:
        runner.trainer.close()
    # MMCV: a train_step without log_vars logs only the schedule values; validation at iterations + 1
    wandb.wandb.log.assert_called_with({'learning_rate': 0.02, 'momentum': 0.95}, step=6, commit=True)
    wandb.wandb.join.assert_called_with()
    pavi.writer.add_scalars.assert_any_call('train', {'learning_rate': 0.02, 'momentum': 0.95}, 3)
    pavi.writer.add_scalars.assert_called_with('val', {'learning_rate': 0.02, 'momentum': 0.95}, 1)


def test_schedule_hook_arguments_raise_mmcv_types():
    from hookloop.compat.mmcv import CyclicLrUpdaterHook, GradientCumulativeOptimizerHook, StepLrUpdaterHook
    with pytest.raises(AssertionError):  # MMCV asserts by_epoch=False
        CyclicLrUpdaterHook(by_epoch=True)
    with pytest.raises(AssertionError):
        StepLrUpdaterHook(-10)
    with pytest.raises(ValueError):  # still hookloop's ConfigError (a ValueError)
        CyclicLrUpdaterHook(by_epoch=False, anneal_strategy='sin')
    with pytest.raises(ConfigError):
        GradientCumulativeOptimizerHook(cumulative_iters='str')


@pytest.mark.parametrize('kind', ['EpochBasedRunner', 'IterBasedRunner'])
def test_eval_hook_evaluate_is_the_extension_point(tmp_path, kind):
    from unittest.mock import MagicMock

    from hookloop.compat.mmcv import EvalHook, build_runner

    class Passthrough(StepModel):
        def train_step(self, data, optimizer, **kwargs):  # steps nothing: MMCV runs it without an optimizer
            return dict(x=data)

    by_epoch = kind == 'EpochBasedRunner'
    loader = torch.utils.data.DataLoader(torch.ones(5, 2))
    counts = []
    for start, interval, length in ((None, 1, 2), (1, 2, 3), (0, 1, 2)):
        runner = build_runner(dict(type=kind), default_args=dict(model=Passthrough(), logger=logging.getLogger('t'),
                                                                 work_dir=str(tmp_path / f'{kind}{start}')))
        hook = EvalHook(loader, start=start, interval=interval, by_epoch=by_epoch)
        hook.evaluate = MagicMock(return_value=None)
        runner.register_hook(hook)
        try:
            runner.run([loader], [('train', 1)], length)  # the third argument: max_epochs / max_iters
        finally:
            runner.trainer.close()
        counts.append(hook.evaluate.call_count)
    # MMCV: after 1 and 2; after 1 and 3; before the first and after 1 and 2
    assert counts == [2, 2, 3]


def test_batch_processor_drives_the_step(tmp_path):
    from hookloop.compat.mmcv import EpochBasedRunner
    calls = []

    def batch_processor(model, data, train_mode):
        calls.append(train_mode)
        return dict(loss=model(data).sum())

    model = torch.nn.Linear(2, 1)
    with pytest.warns(UserWarning, match='deprecated'):
        runner = EpochBasedRunner(model, batch_processor, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                  work_dir=str(tmp_path), logger=logging.getLogger('t'), max_epochs=1)
    with pytest.raises(RuntimeError):
        EpochBasedRunner(StepModel(), batch_processor, logger=logging.getLogger('t'))
    runner.register_checkpoint_hook(dict(interval=1))
    try:
        runner.run([torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)], [('train', 1)])
    finally:
        runner.trainer.close()
    assert calls == [True, True] and runner.model is model
    assert set(torch.load(str(tmp_path / 'latest.pth'), weights_only=True)['state_dict']) == {'weight', 'bias'}
