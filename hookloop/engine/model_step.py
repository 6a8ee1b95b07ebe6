"""The model step contract: how a batch reaches the model and what comes back."""
import functools
import inspect
from collections.abc import Mapping

import torch

from ..data.device import map_tensors, move_to_device  # noqa: F401  (move_to_device: the trainer's)
from ..errors import ConfigError


def detach_outputs(outputs):
    """A step's outputs (a Mapping) as a plain dict of detached values: holding it keeps no
    autograd graph (and none of the activations it saved) alive."""
    return {key: map_tensors(value, torch.Tensor.detach) for key, value in outputs.items()}


def call_model(model, batch):
    """A Mapping batch is passed as keywords, a tuple/list as positional arguments,
    anything else as the single argument."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def as_outputs(outputs):
    """Model outputs as a Mapping: a tensor is ``{'loss': tensor}``; a Mapping (an HF
    ``ModelOutput`` too) is used as is; another object with ``.loss`` contributes its
    public attributes."""
    if isinstance(outputs, torch.Tensor):
        return {'loss': outputs}
    if isinstance(outputs, Mapping):
        return outputs
    if hasattr(outputs, 'loss'):
        fields = {k: v for k, v in vars(outputs).items() if not k.startswith('_')} if hasattr(outputs, '__dict__') else {}
        fields['loss'] = outputs.loss
        return fields
    raise ConfigError(f'the model (or loss_fn) returned a {type(outputs).__name__}; a training step must return '
                    'a loss tensor, a dict with a "loss" entry, or an object with a .loss attribute '
                    '(pass loss_fn=... to turn plain outputs into a loss)')


# -- MMCV-style models ---------------------------------------------------------------------------
def sum_loss_terms(outputs):
    """MMCV's ``_parse_losses`` rule for outputs without a ``'loss'`` entry: every key whose
    name contains ``'loss'`` (a tensor, or a list of tensors, each reduced by its mean) is
    summed into ``'loss'``. Returns the outputs (a new dict when a total was added) and the
    terms to log, ``{key: scalar tensor}`` (no host sync: they stay on the device)."""
    terms = {}
    for key, value in outputs.items():
        if 'loss' not in key:
            continue
        if isinstance(value, torch.Tensor):
            terms[key] = value.mean() if value.dim() else value
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            terms[key] = sum(v.mean() for v in value)
    if 'loss' in outputs or not terms:
        return outputs, terms
    total = sum(terms.values())
    return {**outputs, 'loss': total}, {**terms, 'loss': total}


def has_train_step(model):
    """True for an MMCV-style model that runs its own step: ``train_step(data_batch, optimizer)``."""
    return callable(getattr(model, 'train_step', None))


def mmcv_train_step(model, batch, optimizer):
    """Call ``model.train_step(batch, optimizer)`` (MMCV's contract): it returns
    ``dict(loss=..., log_vars=..., num_samples=...)``; with several optimizers the model
    steps them itself. Returns the outputs and the values to log (``log_vars``)."""
    outputs = model.train_step(batch, optimizer)
    if not isinstance(outputs, Mapping):
        raise ConfigError(f'{type(model).__name__}.train_step returned a {type(outputs).__name__}; MMCV\'s contract '
                          'is a dict(loss=..., log_vars=..., num_samples=...)')
    log_vars = outputs.get('log_vars')
    if log_vars is None:
        outputs, log_vars = sum_loss_terms(outputs)
    return outputs, log_vars


def accepts_return_loss(model):
    """MMCV models take ``return_loss`` in ``forward``; evaluation calls them with ``False``.
    A wrapper that hands its arguments to ``.module`` (``MMDataParallel``) answers for its model."""
    while getattr(type(model), 'passes_arguments_to_module', False):
        model = model.module
    return _forward_takes_return_loss(type(model))


@functools.lru_cache(maxsize=None)
def _forward_takes_return_loss(model_type):  # per class: validation asks at every batch
    try:
        return 'return_loss' in inspect.signature(model_type.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def val_forward(wrapped_model, model, batch, evaluator):
    """The validation forward. For an MMCV model: ``model.val_step(batch, None)`` (MMCV's
    workflow ``('val', k)``), or — when it has no ``val_step`` or the evaluator asks for
    test outputs (``evaluator.wants_test_outputs``, as MMCV's ``EvalHook``) —
    ``model(..., return_loss=False)``. Any other model: the same call as in training."""
    wants_test_outputs = getattr(evaluator, 'wants_test_outputs', False)
    if has_train_step(model) and callable(getattr(model, 'val_step', None)) and not wants_test_outputs:
        return model.val_step(batch, None)
    if not accepts_return_loss(model):
        return call_model(wrapped_model, batch)
    if isinstance(batch, Mapping):
        return wrapped_model(**batch, return_loss=False)
    if isinstance(batch, (tuple, list)):
        return wrapped_model(*batch, return_loss=False)
    return wrapped_model(batch, return_loss=False)


def check_losses(outputs, iteration, backward=False):
    """The ``'loss'`` output (what is back-propagated by default) must be a one-element
    tensor; other ``loss*`` terms follow MMCV's rule (reduced by their mean) and are not
    checked here. Shape and type only: no device sync. With ``backward`` (the run has an
    optimizer) a plain Python number is refused too: it carries no gradient."""
    for key, value in outputs.items():
        if key != 'loss':
            continue
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ConfigError(f'the model output {key!r} at iteration {iteration} is a tensor of shape '
                                  f'{tuple(value.shape)}, not a scalar; reduce it (e.g. .mean()) in the model '
                                  'or loss_fn')
        elif backward and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ConfigError(f'the model output {key!r} at iteration {iteration} is a Python {type(value).__name__} '
                              f'({value!r}), which carries no gradient to back-propagate; return the loss as a '
                              'tensor (do not call .item() on it)')
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f'the model output {key!r} at iteration {iteration} is a {type(value).__name__}, '
                              'not a scalar tensor')
