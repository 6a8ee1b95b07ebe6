"""FSDP2 (``fully_shard``) wrapping and sharded checkpoints through torch.distributed.checkpoint.

Under ``strategy='fsdp'`` a checkpoint path names a *directory*:

* the model and optimizer tensors, each rank writing its own shards, via
  ``torch.distributed.checkpoint`` (``*.distcp`` files plus ``.metadata``);
* ``shards.sha256``: the SHA-256 of every shard file and of ``.metadata`` (``sha256sum``
  format), written by rank 0 once all shards are on disk;
* ``hookloop.pth``: everything else (counters, hook states, RNG, config), written by
  rank 0 alone with the ordinary atomic writer and read back with ``weights_only``.

``hookloop.pth`` records the digest of ``shards.sha256``, so removing the manifest does not
switch the check off (:mod:`hookloop.checkpoint.integrity`). Loading verifies the checksums first, reads
``.metadata`` with a restricted unpickler (``dist/dcp_metadata.py``) and checks it against this
run's model and optimizer before any shard is read (``dist/dcp_load.py``): a rigged directory
runs no code and reads nothing outside itself.

Resuming needs the same model and a process group of any size: DCP reshards. Tensors in
hook states (EMA averages) that are sharded like the parameters (DTensors) are saved by every
rank through DCP too, not from rank 0's shard alone; ``hookloop.pth`` holds a placeholder
naming their DCP key, and a resume loads them into the hooks' current (resharded) tensors.
Sharded checkpoints are local-only: their directory must be a local path. Recognising and
verifying the directory's files is :mod:`hookloop.checkpoint.sharded_files`'s (no process group needed).
"""
import os
from collections.abc import Mapping

import torch

from ..checkpoint.format import save_checkpoint, update_pointer
from ..checkpoint.sharded_files import MANIFEST_DIGEST, META_FILE, verify_shard_files, write_shard_checksums
# engine/trainer.py (being split on another branch) imports it from here; drop once nothing does.
from ..checkpoint.sharded_files import is_sharded_checkpoint  # noqa: F401
from ..errors import CheckpointError, ConfigError
from .dcp_load import check_storage, load_dcp, shard_ends
from .dcp_metadata import read_dcp_metadata

PLACEHOLDER = 'hookloop.dcp:'  # a hook-state tensor stored in the DCP files under the key that follows


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


def _tensor_states(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        return {'model': get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {'model': model_state, 'optimizer': optim_state}


def _pull_dtensors(tree, key, found):
    """``tree`` with each DTensor replaced by ``PLACEHOLDER + its key``, collected in ``found``."""
    from torch.distributed.tensor import DTensor
    if isinstance(tree, DTensor):
        found[key] = tree
        return PLACEHOLDER + key
    if isinstance(tree, Mapping):
        return {k: _pull_dtensors(v, f'{key}.{k}' if key else str(k), found) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_pull_dtensors(v, f'{key}.{i}', found) for i, v in enumerate(tree))
    return tree


def _push_tensors(tree, loaded):
    """The inverse of :func:`_pull_dtensors`: placeholders replaced by ``loaded[key]``
    (None where nothing was loaded for the key)."""
    if isinstance(tree, str) and tree.startswith(PLACEHOLDER):
        return loaded.get(tree[len(PLACEHOLDER):])
    if isinstance(tree, Mapping):
        return {k: _push_tensors(v, loaded) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_push_tensors(v, loaded) for v in tree)
    return tree


def _refuse_accumulated_grads(hook_states):
    """FSDP2 reduce-scatters every backward, so mid-window gradients are sharded partial sums
    that a resume could not place (the optimizer hook's ``grads`` state)."""
    for name, state in hook_states.items():
        if isinstance(state, Mapping) and state.get('grads') is not None:
            raise CheckpointError(f'strategy="fsdp": cannot save inside a gradient-accumulation window ({name} '
                                  'holds accumulated gradients, which a sharded checkpoint does not restore); '
                                  'save at window ends: a checkpoint interval that is a multiple of cumulative_iters')


def save_sharded(checkpoint, path, model, optimizer, rank, pointer_dir=None, writer=None):
    """Write ``checkpoint`` (the trainer's dict) as a sharded checkpoint directory ``path``,
    then (rank 0, with ``pointer_dir``) move that directory's ``last_checkpoint`` to it.

    Every rank must call this. The ``state_dict`` and ``optimizer`` entries of
    ``checkpoint`` are replaced by DCP's sharded states of ``model`` and ``optimizer``;
    DTensors elsewhere (hook states, ``ema_state_dict``) are saved through DCP as ``extra``.
    With ``writer`` (an :class:`~hookloop.checkpoint.async_writer.AsyncCheckpointWriter`) the shards
    are written by ``torch.distributed.checkpoint.async_save`` in the background; the
    metadata file and the pointer follow when every rank's shards are on disk.
    """
    import torch.distributed.checkpoint as dcp
    if '://' in os.fspath(path):
        raise ConfigError(f'{path!r}: sharded (FSDP) checkpoints are written to a local directory only; '
                          'give a local work_dir / out_dir')
    _refuse_accumulated_grads(checkpoint.get('hooks', {}))
    os.makedirs(path, exist_ok=True)
    states = _tensor_states(model, optimizer if 'optimizer' in checkpoint else None)
    extra = {}
    rest = _pull_dtensors({k: v for k, v in checkpoint.items() if k not in ('state_dict', 'optimizer')}, '', extra)
    if extra:
        states['extra'] = extra
    rest['sharded'] = sorted(states)

    def finish():
        torch.distributed.barrier()  # every rank's shards are written (and .metadata)
        if rank == 0:
            rest[MANIFEST_DIGEST] = write_shard_checksums(path)
            # Written last: its presence marks the directory as a complete checkpoint.
            save_checkpoint(rest, os.path.join(path, META_FILE))
            if pointer_dir is not None:
                update_pointer(pointer_dir, path)
        torch.distributed.barrier()

    if writer is None:
        dcp.save(states, checkpoint_id=path)
        finish()
    else:
        # The background writes coordinate over a group of their own, so their collectives
        # never interleave with the training's on the default group.
        if getattr(writer, 'process_group', None) is None:
            writer.process_group = torch.distributed.new_group(backend='gloo')
        writer.submit_sharded(dcp.async_save(states, checkpoint_id=path, process_group=writer.process_group), finish)


def verify_sharded(path):
    """Check a sharded checkpoint directory without running anything from it: its files
    (:func:`~hookloop.checkpoint.sharded_files.verify_shard_files`), ``.metadata`` (read
    through the restricted unpickler once it matched its digest) and its storage entries inside
    the directory, each shard file no larger than they span before it is hashed. Returns
    ``hookloop.pth``'s dict; CheckpointError names what is wrong."""
    checked = []

    def shard_sizes(path):  # once .metadata matched its digest: bounds the shards before they are hashed
        checked.append(check_storage(read_dcp_metadata(path), path))
        return shard_ends(checked[0])
    rest = verify_shard_files(path, shard_sizes)
    if not checked:  # no manifest (HOOKLOOP_ALLOW_UNVERIFIED) or no shard file: the metadata is checked all the same
        check_storage(read_dcp_metadata(path), path)
    return rest


def load_sharded(path, model, optimizer, hook_states=None):
    """Load the model (and optimizer) shards of ``path`` in place; returns the rest of
    the checkpoint (``meta``, ``hooks``, ``rng``, ...).

    ``hook_states``: the hooks' current ``state_dict()`` by name; their DTensors (sharded for
    this run) receive the saved sharded hook tensors, which the returned ``hooks`` hold."""
    from torch.distributed.checkpoint.state_dict import set_state_dict
    rest = verify_sharded(path)
    with_optimizer = optimizer is not None and 'optimizer' in rest.get('sharded', ())
    states = _tensor_states(model, optimizer if with_optimizer else None)
    targets = {}
    _pull_dtensors({'hooks': hook_states or {}}, '', targets)
    wanted = set()
    _collect_placeholders(rest.get('hooks', {}), wanted)
    missing = sorted(wanted - set(targets))
    if missing:
        raise CheckpointError(f'{path!r} holds sharded hook state {missing[:3]} that no hook of this run '
                              'has a sharded tensor for (a different hook set or model?)')
    if wanted:
        states['extra'] = {key: targets[key] for key in sorted(wanted)}
    load_dcp(states, path)  # checked against these states before any shard is read
    rest = _push_tensors(rest, states.get('extra', {}))
    if with_optimizer:
        set_state_dict(model, optimizer, model_state_dict=states['model'], optim_state_dict=states['optimizer'])
    else:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict
        set_model_state_dict(model, states['model'])
    return rest


def _collect_placeholders(tree, keys):
    if isinstance(tree, str) and tree.startswith(PLACEHOLDER):
        keys.add(tree[len(PLACEHOLDER):])
    elif isinstance(tree, Mapping):
        for value in tree.values():
            _collect_placeholders(value, keys)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            _collect_placeholders(value, keys)
