"""Checkpoint files: atomic writes, safe loads, the ``last_checkpoint`` pointer, RNG state.

A checkpoint is a dict of tensors and plain containers, so
``torch.load(weights_only=True)`` reads it and a stranger's file runs no code.
"""
import glob
import io
import os
import pickle
import shutil
import random
import re
import tempfile

import numpy as np
import torch

from . import storage
from .errors import CheckpointError

POINTER_NAME = 'last_checkpoint'
TMP_SUFFIX = '.tmp'


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, write):
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, rename it to
    ``path``. On any error the temporary file is removed and ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix=TMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, 'wb') as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def remove_checkpoint(path):
    """Delete a checkpoint: a file, or an FSDP checkpoint directory of shards."""
    if storage.is_url(path):
        return storage.remove(path)
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def save_checkpoint(checkpoint, path):
    """Write ``checkpoint`` to ``path`` atomically; CheckpointError on I/O failure."""
    write = storage.write_atomic_url if storage.is_url(path) else atomic_write
    try:
        write(path, lambda f: torch.save(checkpoint, f))
    except (OSError, RuntimeError) as exc:  # torch's zip writer reports a failed write as RuntimeError
        raise CheckpointError(f'could not write checkpoint {path}: {getattr(exc, "strerror", None) or exc}; '
                              'the previous checkpoint is kept') from exc


def write_checkpoint(checkpoint, path, pointer_dir=None):
    """Save ``checkpoint`` to ``path`` atomically, then (with ``pointer_dir``) move that
    directory's ``last_checkpoint`` pointer to it: the order that keeps the pointer valid."""
    save_checkpoint(checkpoint, path)
    if pointer_dir is not None:
        update_pointer(pointer_dir, path)


def update_pointer(work_dir, checkpoint_path):
    """Point ``<work_dir>/last_checkpoint`` at ``checkpoint_path`` (atomically).

    Called only after the checkpoint itself is renamed into place, so the pointer
    always names a complete file."""
    target = storage.normalize(checkpoint_path)
    write = storage.write_atomic_url if storage.is_url(work_dir) else atomic_write
    try:
        write(storage.join(work_dir, POINTER_NAME), lambda f: f.write(target.encode()))
    except OSError as exc:
        raise CheckpointError(f'could not update {os.path.join(work_dir, POINTER_NAME)}: '
                              f'{getattr(exc, "strerror", None) or exc}; it still names the previous checkpoint') from exc


def remove_stale_temporaries(directory):
    """Delete ``.<name>.<random>.tmp`` files that a killed writer left in ``directory``.

    Only rank 0 of the run that owns ``directory`` should call this, before it saves."""
    if storage.is_url(directory):
        return storage.remove_stale_temporaries_url(directory)
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory), '.*' + TMP_SUFFIX)):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def save_safetensors(state_dict, path):
    """Export tensors (weights only, no code, no pickle) to ``path`` atomically."""
    try:
        from safetensors.torch import save as safetensors_bytes
    except ImportError:
        raise CheckpointError('safetensors export needs the safetensors package (pip install safetensors)') from None
    # safetensors refuses shared or non-contiguous storage; a private contiguous copy
    # of each tensor is what a weights file should hold anyway.
    tensors = {key: value.detach().to('cpu').contiguous().clone() for key, value in state_dict.items()
               if hasattr(value, 'detach')}
    write = storage.write_atomic_url if storage.is_url(path) else atomic_write
    try:
        write(path, lambda f: f.write(safetensors_bytes(tensors)))
    except OSError as exc:
        raise CheckpointError(f'could not write {path}: {getattr(exc, "strerror", None) or exc}') from exc


def read_pointer(work_dir):
    """The checkpoint path the pointer names, or None when there is no pointer."""
    pointer = storage.join(os.fspath(work_dir), POINTER_NAME)
    if not storage.exists(pointer):
        return None
    path = storage.read_bytes(pointer).decode('utf-8').strip()
    return storage.join(os.fspath(work_dir), path)


def load_checkpoint(path, map_location='cpu'):
    """Load a checkpoint with ``weights_only=True``; anything else is a CheckpointError."""
    if not storage.exists(path):
        raise CheckpointError(f'checkpoint {path!r} does not exist')
    if storage.isdir(path):
        raise CheckpointError(f'checkpoint {path!r} is a directory, not a checkpoint file')
    source = io.BytesIO(storage.read_bytes(path)) if storage.is_url(path) else path
    try:
        checkpoint = torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r'GLOBAL (\S+)', str(exc))
        what = f' (it references {found.group(1)})' if found else ''
        raise CheckpointError(f'refusing to load {path!r}: it holds objects that would need arbitrary code to '
                              f'unpickle{what}; hookloop loads checkpoints with weights_only=True only') from None
    except Exception as exc:  # torch raises many kinds for a file that is not a checkpoint
        raise CheckpointError(f'{path!r} is not a readable checkpoint: {str(exc).splitlines()[0]}') from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f'{path!r} is not a hookloop checkpoint (got {type(checkpoint).__name__})')
    return checkpoint


# -- random number generators, in a weights_only-safe form ---------------------------------

def get_rng_state():
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        'python': {'version': version, 'state': list(internal), 'gauss': gauss},
        'numpy': {'name': name, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
                  'has_gauss': int(has_gauss), 'cached_gaussian': float(cached)},
        'torch': torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    python = state['python']
    random.setstate((python['version'], tuple(python['state']), python['gauss']))
    numpy = state['numpy']
    # A checkpoint loaded with map_location='cuda' has its RNG tensors on the GPU;
    # the generators take CPU byte tensors.
    np.random.set_state((numpy['name'], numpy['keys'].cpu().numpy().astype(np.uint32), numpy['pos'],
                         numpy['has_gauss'], numpy['cached_gaussian']))
    torch.set_rng_state(state['torch'].cpu())
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state['cuda']])
