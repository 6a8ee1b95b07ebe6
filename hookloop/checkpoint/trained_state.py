"""Checkpoints without the frozen weights (``CheckpointHook(save_frozen=False)``).

A fine-tuning run often trains a small part of a large model (a UNet next to a frozen VAE
and text encoder, or LoRA adapters inside a frozen base). Its checkpoints need only what
training changes: :func:`trained_state_dict` keeps the parameters with ``requires_grad``
and the buffers of the modules that own such parameters or run in training mode. On resume the frozen part comes
from the model as built (e.g. from the base pipeline directory); a fingerprint of its
contents, stored in the checkpoint, makes sure it is the same frozen part it was saved
with, so a different base is refused instead of silently mixed in.
"""
import contextlib
import hashlib
import weakref

import torch

from ..errors import CheckpointError


@contextlib.contextmanager
def training_mode(model):
    """``model`` as training runs it (``model.train()``, which a model may override to keep a
    frozen BatchNorm in eval mode), then every module's own mode back: what is trained does
    not depend on when a checkpoint is saved or loaded (during validation, before the run)."""
    modes = [(module, module.training) for module in model.modules()]
    model.train()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


def trained_keys(model):
    """The ``model.state_dict()`` keys of trainable parameters, and of the buffers of modules
    that own a trainable parameter or are in training mode when the model trains
    (:func:`training_mode`; a frozen BatchNorm left in training mode still updates its running
    statistics: they are part of what training changes)."""
    with training_mode(model):
        return _trained_keys(model)


def _trained_keys(model):
    keys = set()
    for prefix, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        trains = any(p.requires_grad for _, p in own)
        dot = f'{prefix}.' if prefix else ''
        keys.update(dot + name for name, p in own if p.requires_grad)
        if trains or module.training:
            keys.update(dot + name for name, _ in module.named_buffers(recurse=False))
    return keys


def trained_state_dict(model):
    """``model.state_dict()`` restricted to :func:`trained_keys` (same keys and tensors)."""
    keys = trained_keys(model)
    return {key: value for key, value in model.state_dict().items() if key in keys}


_FINGERPRINTS = weakref.WeakKeyDictionary()  # model -> (what the hash was computed over, hash)


def frozen_fingerprint(model):
    """A content hash (BLAKE2b, hex) of every ``state_dict`` entry that is not trained:
    names, dtypes, shapes and bytes. The first call reads the frozen weights once; later
    calls reuse it while the same tensors are there unmodified (torch counts in-place
    writes in ``tensor._version``), so periodic checkpoints do not re-hash gigabytes."""
    keys = trained_keys(model)
    frozen = [(key, value) for key, value in sorted(model.state_dict().items())
              if key not in keys and isinstance(value, torch.Tensor)]
    signature = tuple((key, value.data_ptr(), value._version, value.dtype, tuple(value.shape))
                      for key, value in frozen)
    cached = _FINGERPRINTS.get(model)
    if cached is not None and cached[0] == signature:
        return cached[1]
    digest = hashlib.blake2b(digest_size=16)
    for key, value in frozen:
        tensor = value.detach().cpu().contiguous()
        digest.update(f'{key}|{tensor.dtype}|{tuple(tensor.shape)}|'.encode())
        if tensor.numel():
            digest.update(tensor.view(-1).view(torch.uint8).numpy())
    _FINGERPRINTS[model] = (signature, digest.hexdigest())
    return digest.hexdigest()


def frozen_meta(model):
    """The ``meta['frozen']`` entry of a checkpoint saved without the frozen weights."""
    return {'saved': False, 'fingerprint': frozen_fingerprint(model)}


def load_trained_state(model, state, meta, path):
    """Load a checkpoint saved with ``save_frozen=False`` into ``model``: the frozen part
    must hash to the stored fingerprint, and the saved keys must be the model's trained ones."""
    expected = meta.get('fingerprint')
    actual = frozen_fingerprint(model)
    if expected != actual:
        raise CheckpointError(
            f'{path!r} holds only the trained weights and was saved on top of different frozen weights '
            f'(fingerprint {expected}, this model has {actual}): resume with the same base model '
            '(pipeline directory, revision/variant and precision) the run started from')
    missing, unexpected = model.load_state_dict(state, strict=False)
    not_restored = sorted(set(missing) & trained_keys(model))
    if unexpected or not_restored:
        raise CheckpointError(f'{path!r} does not fit this model: unexpected keys {sorted(unexpected)[:5]}, '
                              f'trained keys missing from it {not_restored[:5]}')
