"""FSDP2 (``fully_shard``) wrapping and sharded checkpoints through torch.distributed.checkpoint.

Under ``strategy='fsdp'`` a checkpoint path names a *directory*:

* the model and optimizer tensors, each rank writing its own shards, via
  ``torch.distributed.checkpoint`` (``*.distcp`` files plus ``.metadata``);
* ``shards.sha256``: the SHA-256 of every shard file and of ``.metadata`` (``sha256sum``
  format), written by rank 0 once all shards are on disk;
* ``hookloop.pth``: everything else (counters, hook states, RNG, config), written by
  rank 0 alone with the ordinary atomic writer and read back with ``weights_only``.

Loading verifies the checksums first and reads ``.metadata`` with a restricted unpickler
(``dcp_metadata.py``), so a rigged directory runs no code.

Resuming needs the same model and a process group (any world size DCP can reshard to).
"""
import os

import torch

from .checkpoint import atomic_write, file_checksum, load_checkpoint, save_checkpoint
from .dcp_metadata import METADATA_FILE, read_dcp_metadata, safe_reader
from .errors import CheckpointError, ConfigError

META_FILE = 'hookloop.pth'
SHARD_CHECKSUMS = 'shards.sha256'


def fsdp2_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def shard_model(model, device=None):
    """Apply ``fully_shard`` to each direct child that holds parameters, then to the root.

    Sharding the children separately lets FSDP free one child's gathered parameters
    before the next child's are gathered; the root catches the remaining parameters.
    The model is changed in place and returned.
    """
    if not fsdp2_available():
        raise ConfigError(f'strategy="fsdp" needs FSDP2 (torch.distributed.fsdp.fully_shard), '
                          f'which torch {torch.__version__} does not have; use strategy="ddp"')
    from torch.distributed.fsdp import fully_shard
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError('strategy="fsdp" needs a model with trainable parameters')
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    return model


def is_sharded_model(model):
    """True for a model that ``fully_shard`` changed (its class is an FSDPModule)."""
    if not fsdp2_available():
        return False
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def is_sharded_checkpoint(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_FILE))


def _tensor_states(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        return {'model': get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {'model': model_state, 'optimizer': optim_state}


def save_sharded(checkpoint, path, model, optimizer, rank):
    """Write ``checkpoint`` (the trainer's dict) as a sharded checkpoint directory ``path``.

    Every rank must call this. The ``state_dict`` and ``optimizer`` entries of
    ``checkpoint`` are replaced by DCP's sharded states of ``model`` and ``optimizer``.
    """
    import torch.distributed.checkpoint as dcp
    os.makedirs(path, exist_ok=True)
    states = _tensor_states(model, optimizer if 'optimizer' in checkpoint else None)
    dcp.save(states, checkpoint_id=path)
    if rank == 0:
        write_shard_checksums(path)
        # Written last: its presence marks the directory as a complete checkpoint.
        rest = {k: v for k, v in checkpoint.items() if k not in ('state_dict', 'optimizer')}
        rest['sharded'] = sorted(states)
        save_checkpoint(rest, os.path.join(path, META_FILE))
    torch.distributed.barrier()


def load_sharded(path, model, optimizer):
    """Load the model (and optimizer) shards of ``path`` in place; returns the rest of
    the checkpoint (``meta``, ``hooks``, ``rng``, ...)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    rest = verify_sharded(path)
    with_optimizer = optimizer is not None and 'optimizer' in rest.get('sharded', ())
    states = _tensor_states(model, optimizer if with_optimizer else None)
    dcp.load(states, storage_reader=safe_reader(path))
    if with_optimizer:
        set_state_dict(model, optimizer, model_state_dict=states['model'], optim_state_dict=states['optimizer'])
    else:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict
        set_model_state_dict(model, states['model'])
    return rest


def _shard_files(path):
    return sorted(name for name in os.listdir(path) if name.endswith('.distcp') or name == METADATA_FILE)


def write_shard_checksums(path):
    """``<path>/shards.sha256``: the checksum of every file DCP wrote (rank 0, after the shards)."""
    lines = ''.join(f'{file_checksum(os.path.join(path, name))}  {name}\n' for name in _shard_files(path))
    atomic_write(os.path.join(path, SHARD_CHECKSUMS), lambda f: f.write(lines.encode()))


def verify_sharded(path):
    """Check a sharded checkpoint directory without running anything from it: the shard
    checksums, ``.metadata`` through the restricted unpickler, ``hookloop.pth`` with
    ``weights_only``. Returns ``hookloop.pth``'s dict; CheckpointError names what is wrong."""
    if not is_sharded_checkpoint(path):
        raise CheckpointError(f'{path!r} is not a sharded hookloop checkpoint (no {META_FILE} inside)')
    manifest = os.path.join(path, SHARD_CHECKSUMS)
    if os.path.isfile(manifest):
        try:
            with open(manifest, encoding='ascii') as f:
                expected = dict(reversed(line.split(None, 1)) for line in f.read().splitlines() if line.strip())
        except (OSError, UnicodeDecodeError, ValueError):
            raise CheckpointError(f'{manifest!r} is damaged') from None
        expected = {name.strip(): digest for name, digest in expected.items()}
        for name in sorted(set(expected) | set(_shard_files(path))):
            file = os.path.join(path, name)
            if name not in expected:
                raise CheckpointError(f'{file!r} is not listed in {SHARD_CHECKSUMS}: not part of this checkpoint')
            if not os.path.isfile(file):
                raise CheckpointError(f'{file!r} is missing from the sharded checkpoint')
            if file_checksum(file) != expected[name]:
                raise CheckpointError(f'{file!r} is damaged: its SHA-256 does not match {SHARD_CHECKSUMS}')
    read_dcp_metadata(path)
    return load_checkpoint(os.path.join(path, META_FILE))
