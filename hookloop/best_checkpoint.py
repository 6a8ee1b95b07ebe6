"""Keeping the checkpoint with the best value of one metric (``save_best``).

Shared by ``CheckpointHook(save_best=...)`` and ``EvaluationHook(save_best=...)`` (MMCV's
``EvalHook`` has the argument, so MMCV configs use it there); each hook owns its own
instance and state.
"""
import math
import os

from . import storage
from .checkpoint import inside, remove_checkpoint
from .errors import ConfigError

# Substrings of metric names whose larger / smaller value is better (case-insensitive),
# used when ``rule`` is not given. 'less' is checked first: 'top1_err' is an error.
_LESS_IS_BETTER = ('loss', 'err', 'mse', 'mae', 'rmse', 'perplexity', 'wer', 'cer')
_GREATER_IS_BETTER = ('acc', 'top', 'ar@', 'auc', 'precision', 'recall', 'f1', 'map', 'dice', 'iou', 'psnr',
                      'ssim', 'bleu', 'rouge', 'score')


def infer_rule(metric):
    """'greater' or 'less' for a common metric name, else None."""
    name = metric.lower()
    if any(key in name for key in _LESS_IS_BETTER):
        return 'less'
    if any(key in name for key in _GREATER_IS_BETTER):
        return 'greater'
    return None


class BestCheckpoint:
    """Writes ``best_<metric>_<epoch_n|iter_n>.pth`` whenever a new evaluation improves the
    metric, and removes the previous best file.

    Args:
        owner: the hook's name, for error messages.
        save_best: a key of ``trainer.metrics``, or ``'auto'`` for the first key.
        rule: ``'greater'`` / ``'less'``; inferred from the name when None.
    """

    def __init__(self, owner, save_best, rule=None):
        if not isinstance(save_best, str) or not save_best:
            raise ConfigError(f'{owner} save_best must be a metric name or "auto", got {save_best!r}')
        if rule not in (None, 'greater', 'less'):
            raise ConfigError(f"{owner} rule must be 'greater' or 'less', got {rule!r}")
        if save_best != 'auto' and rule is None:
            rule = infer_rule(save_best)
            if rule is None:
                raise ConfigError(f'{owner} cannot tell whether a larger {save_best!r} is better; '
                                  "give rule='greater' or rule='less'")
        self.owner, self.save_best, self.rule = owner, save_best, rule
        self.score = None  # the best finite score so far; None: none yet (as -inf / +inf by the rule)
        self.path = None          # absolute, once known
        self.metric = None if save_best == 'auto' else save_best
        self._seen = 0  # trainer.position.validations when the metrics were last looked at
        self._directory = None
        self._stored_path = None  # from a checkpoint: relative to the directory of the run

    def bind(self, directory):
        """Resolve paths against ``directory`` (the owner's save directory). A stored path
        that lands outside it (another run's file) is forgotten, never deleted."""
        self._directory = directory
        if self._stored_path is not None:
            path = storage.resolve(directory, self._stored_path)
            self.path = path if inside(path, directory) else None
            self._stored_path = None

    def update(self, trainer, directory, filename, write):
        """Look at ``trainer.metrics`` after a new validation; when its score is better,
        ``write(path)`` the best checkpoint as ``<directory>/best_<metric>_<filename>``.
        Returns True when it did. An empty result or a non-finite score is warned about and
        never becomes the best."""
        # The validation count tells a new result from an old one, so on the other
        # iterations nothing is read (and no device value synced).
        if trainer.position.validations == self._seen:
            return False
        self._seen = trainer.position.validations
        metrics = trainer.metrics
        if not metrics:
            trainer.logger.warning('%s save_best=%r: the evaluation returned no metrics; the best checkpoint is '
                                   'not updated this time', self.owner, self.save_best)
            return False
        self.bind(directory)
        key = self._key(metrics)
        score = float(metrics[key])
        if not math.isfinite(score):
            trainer.logger.warning('%s save_best: %s = %s is not finite; it is ignored for the best checkpoint',
                                   self.owner, key, score)
            return False
        best = self.score if self.score is not None else (-math.inf if self.rule == 'greater' else math.inf)
        if not (score > best if self.rule == 'greater' else score < best):
            return False
        previous = self.path
        self.score, self.metric = score, key
        self.path = storage.join(directory, self.file_name(key, score, filename))
        write(self.path)
        if trainer.rank == 0 and previous and previous != self.path and inside(previous, directory):
            for victim in (previous, os.path.splitext(previous)[0] + '.safetensors'):
                if storage.exists(victim):
                    remove_checkpoint(victim)
        trainer.logger.info('new best %s = %.6g: saved %s', key, score, self.path)
        return True

    def file_name(self, key, score, filename):
        """The best file's name when ``key`` reached ``score`` at ``filename`` (``epoch_3.pth``)."""
        return f'best_{key}_{filename}'

    def _key(self, metrics):
        if self.save_best == 'auto':
            key = next(iter(metrics))
            if self.rule is None:
                self.rule = infer_rule(key)
                if self.rule is None:
                    raise ConfigError(f"{self.owner} save_best='auto' picked metric {key!r} but cannot tell "
                                      "whether larger is better; give save_best=NAME and rule='greater'|'less'")
            return key
        if self.save_best not in metrics:
            raise ConfigError(f'{self.owner} save_best={self.save_best!r} is not among the evaluation metrics '
                              f'{sorted(metrics)}')
        return self.save_best

    def run_summary(self, trainer):
        if self.path is None:
            return {}
        return {f'best {self.metric}': f'{self.score:.6g} ({_shown(self.path, trainer.storage_dir)})'}

    def state_dict(self):
        path = self.path
        if path is not None and self._directory is not None and inside(path, self._directory):
            path = storage.relpath(path, self._directory)
        return {'best_score': self.score, 'best_path': path, 'rule': self.rule}

    def load_state_dict(self, state):
        self.score = state.get('best_score')
        self.path, self._stored_path = None, state.get('best_path')
        if self._directory is not None:
            self.bind(self._directory)
        self.rule = self.rule or state.get('rule')


def _shown(path, base):
    """``path`` relative to ``base`` when it lies inside it, else as it is."""
    return storage.relpath(path, base) if inside(path, base) else path
