"""Keeping the checkpoint with the best value of one metric (``save_best``).

Shared by ``CheckpointHook(save_best=...)`` and ``EvaluationHook(save_best=...)`` (MMCV's
``EvalHook`` has the argument, so MMCV configs use it there); each hook owns its own
instance and state.
"""
import math
import os
import re

from ..fileio import storage
from .format import inside, remove_checkpoint
from ..errors import ConfigError

# Substrings of metric names whose larger / smaller value is better (case-insensitive),
# used when ``rule`` is not given. 'less' is checked first: 'top1_err' is an error.
_LESS_IS_BETTER = ('loss', 'err', 'mse', 'mae', 'rmse', 'perplexity', 'wer', 'cer')
_GREATER_IS_BETTER = ('acc', 'top', 'ar@', 'auc', 'precision', 'recall', 'f1', 'map', 'dice', 'iou', 'psnr',
                      'ssim', 'bleu', 'rouge', 'score')


# MMCV EvalHook's defaults, used when a config gives greater_keys / less_keys (they replace one list).
MMCV_GREATER_KEYS = ('acc', 'top', 'AR@', 'auc', 'precision', 'mAP', 'mDice', 'mIoU', 'mAcc', 'aAcc')
MMCV_LESS_KEYS = ('loss',)


def infer_rule(metric, greater_keys=None, less_keys=None):
    """'greater' or 'less' for a metric name, else None. With ``greater_keys`` / ``less_keys``
    (an evaluation config's), MMCV ``EvalHook``'s rule: an exact key first, then a key
    contained in the name (case-insensitive), the greater keys before the less keys.
    Without them, the common names above, and ``AP`` / ``AR`` (``AP50``, ``AR@100``, mmpose's keys)."""
    if greater_keys is not None or less_keys is not None:
        greater = [greater_keys] if isinstance(greater_keys, str) else list(greater_keys or MMCV_GREATER_KEYS)
        less = [less_keys] if isinstance(less_keys, str) else list(less_keys or MMCV_LESS_KEYS)
        for rule, keys in (('greater', greater), ('less', less)):
            if metric in keys:
                return rule
        for rule, keys in (('greater', greater), ('less', less)):
            if any(key.lower() in metric.lower() for key in keys):
                return rule
        return None
    name = metric.lower()
    if re.match(r'(ap|ar)([^a-z]|$)', name):
        return 'greater'
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
        greater_keys, less_keys: MMCV's, for inferring the rule (see :func:`infer_rule`).
    """

    def __init__(self, owner, save_best, rule=None, greater_keys=None, less_keys=None):
        if not isinstance(save_best, str) or not save_best:
            raise ConfigError(f'{owner} save_best must be a metric name or "auto", got {save_best!r}')
        if rule not in (None, 'greater', 'less'):
            raise ConfigError(f"{owner} rule must be 'greater' or 'less', got {rule!r}")
        self.keys = (greater_keys, less_keys)
        if save_best != 'auto' and rule is None:
            rule = infer_rule(save_best, *self.keys)
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
        ``write(path, on_disk)`` the best checkpoint as ``<directory>/best_<metric>_<filename>``.
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
        new = self.path

        def on_disk():  # the previous best goes only once the new one is on disk (async saves)
            if trainer.rank == 0 and previous and previous != new and inside(previous, directory) and \
                    storage.exists(new):
                for victim in (previous, os.path.splitext(previous)[0] + '.safetensors'):
                    if storage.exists(victim):
                        remove_checkpoint(victim)
        write(self.path, on_disk)
        trainer.logger.info('new best %s = %.6g: saved %s', key, score, self.path)
        return True

    def file_name(self, key, score, filename):
        """The best file's name when ``key`` reached ``score`` at ``filename`` (``epoch_3.pth``)."""
        return f'best_{key}_{filename}'

    def _key(self, metrics):
        if self.save_best == 'auto':
            key = next(iter(metrics))
            if self.rule is None:
                self.rule = infer_rule(key, *self.keys)
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
        return {'best_score': self.score, 'best_path': path, 'rule': self.rule, 'metric': self.metric}

    def load_state_dict(self, state):
        metric = state.get('metric') or _metric_of(state.get('best_path'))
        if self.save_best != 'auto' and metric is not None and metric != self.save_best:
            # Another metric now: a new record under the new name. The old best file is
            # forgotten, so it is never deleted: it stays, named best_<old metric>_*.
            self.score = self.path = self._stored_path = None
            return
        self.score = state.get('best_score')
        self.path, self._stored_path = None, state.get('best_path')
        if self._directory is not None:
            self.bind(self._directory)
        self.rule = self.rule or state.get('rule')
        self.metric = self.metric or metric


def _metric_of(path):
    """The metric in a best file's name ``best_<metric>_<epoch_n|iter_n>.pth`` (older states)."""
    found = re.match(r'best_(.+)_(?:epoch|iter)_\d+\.pth$', os.path.basename(path)) if isinstance(path, str) else None
    return found.group(1) if found else None


def _shown(path, base):
    """``path`` relative to ``base`` when it lies inside it, else as it is."""
    return storage.relpath(path, base) if inside(path, base) else path
