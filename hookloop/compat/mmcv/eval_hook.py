"""MMCV's ``EvalHook`` / ``DistEvalHook`` over hookloop's ``EvaluationHook``."""
import warnings

import torch

from ...errors import ConfigAssertionError, ConfigError, ConfigTypeError
from ...hooks import EvaluationHook
from ..dataset_evaluator import DatasetEvaluator


class _UnknownRuleError(ConfigError, KeyError):
    """MMCV raises KeyError for a rule that is not 'greater' / 'less'."""


class _HookEvaluator(DatasetEvaluator):
    """The val evaluator of an :class:`EvalHook`: collects the results and hands them to
    the hook's ``evaluate(runner, results)`` (MMCV's extension point)."""

    def __init__(self, hook):
        self.hook, self.trainer = hook, None
        self.reset()

    def compute(self):
        metrics = self.hook.evaluate(self.trainer, self.gathered())
        return dict(metrics) if isinstance(metrics, dict) else {}


class EvalHook(EvaluationHook):
    """MMCV's ``EvalHook(dataloader, interval=1, by_epoch=True, start=None, save_best=None,
    rule=None, **eval_kwargs)``: ``dataset.evaluate(results, **eval_kwargs)`` on the outputs of
    ``model(return_loss=False, **data)``, through the trainer's validation loop. MMCV's
    argument checks and exception types; the best score and file go to
    ``runner.meta['hook_msgs']`` (``best_score``, ``best_ckpt``) when the runner has a meta."""

    def __init__(self, dataloader, start=None, interval=1, by_epoch=True, save_best=None, rule=None,
                 test_fn=None, greater_keys=None, less_keys=None, out_dir=None, file_client_args=None,
                 **eval_kwargs):
        if not isinstance(dataloader, torch.utils.data.DataLoader):
            raise ConfigTypeError(f'dataloader must be a pytorch DataLoader, but got {type(dataloader).__name__}')
        if isinstance(interval, int) and not isinstance(interval, bool) and interval <= 0:
            raise ConfigError(f'interval must be a positive number, but got {interval}')
        if save_best is not None and not isinstance(save_best, str):
            raise ConfigAssertionError(f'save_best should be a str or None, got {type(save_best).__name__}')
        if rule is not None and rule not in ('greater', 'less'):
            raise _UnknownRuleError(f"rule must be 'greater', 'less' or None, got {rule!r}")
        if start is not None and start < 0:
            raise ConfigError(f'The evaluation start epoch {start} is smaller than 0')
        if test_fn is not None:
            raise ConfigError('EvalHook test_fn is not supported: the trainer runs the validation loop')
        super().__init__(interval=interval, by_epoch=by_epoch, start=start, save_best=save_best, rule=rule,
                         greater_keys=greater_keys, less_keys=less_keys)
        self.dataloader = dataloader
        self.eval_kwargs = {k: v for k, v in eval_kwargs.items()
                            if k not in ('gpu_collect', 'tmpdir', 'broadcast_bn_buffer', 'pre_eval')}
        self.evaluator = _HookEvaluator(self)

    def evaluation_loader(self, trainer):
        return self.dataloader

    def before_run(self, trainer):
        # This hook brings the val data and the dataset's evaluator (MMCV's EvalHook holds both).
        trainer.set_validation(self.dataloader, self.evaluator)
        self.evaluator.trainer = trainer
        if self.best is not None and hasattr(trainer, 'hook_messages'):  # an MMCV run's trainer
            trainer.hook_messages()  # MMCV's EvalHook makes runner.meta, to record the best checkpoint in

    def evaluate(self, runner, results):
        """MMCV's: ``dataset.evaluate(results, logger=runner.logger, **eval_kwargs)``; the
        metrics (a dict) or None. Override it (or replace it) as MMCV code does."""
        dataset = self.dataloader.dataset
        if not callable(getattr(dataset, 'evaluate', None)):
            raise ConfigError(f'EvalHook: {type(dataset).__name__} has no evaluate(results, ...) method')
        metrics = dataset.evaluate(results, logger=runner.logger, **self.eval_kwargs)
        if self.best is not None and not metrics:  # MMCV's words (mmdetection issue 6265)
            warnings.warn('Since `eval_res` is an empty dict, the behavior to save the best checkpoint will be '
                          'skipped in this evaluation.')
        return dict(metrics) if isinstance(metrics, dict) else None  # MMCV ignores anything else

    def _keep_best(self, trainer, filename):
        if trainer.metrics:  # else nothing to compare (warned in evaluate): MMCV skips the best checkpoint
            super()._keep_best(trainer, filename)

    def _save_best(self, trainer, path, on_disk):
        # MMCV records the new best in runner.meta before saving, so the best file holds it too
        if trainer.meta is not None:
            messages = trainer.hook_messages()
            messages['best_score'], messages['best_ckpt'] = self.best.score, path
        super()._save_best(trainer, path, on_disk)


DistEvalHook = EvalHook  # ranks evaluate their shard; results are gathered before dataset.evaluate
