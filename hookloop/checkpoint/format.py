"""Checkpoint files: save and load (``weights_only``), remove, the ``last_checkpoint`` pointer.

A checkpoint is a dict of tensors and plain containers, so
``torch.load(weights_only=True)`` reads it and a stranger's file runs no code. The steps of a
save are the gate's (:mod:`hookloop.checkpoint.gate`: atomic write, checksum sidecar).
"""
import io
import os
import pickle
import re
import shutil

import torch

from ..errors import CheckpointError
from ..fileio import hashing
from ..fileio import storage
from . import atomic, checksum, gate
from .atomic import io_reason
from .checksum import CHECKSUM_SUFFIXES
# engine/trainer.py (being split into the Checkpointer on another branch) imports these from here;
# drop this line once nothing does: the RNG state is checkpoint/rng.py's.
from .rng import get_rng_state, set_rng_state  # noqa: F401

POINTER_NAME = 'last_checkpoint'


def save_checkpoint(checkpoint, path):
    """Write ``checkpoint`` to ``path`` (a local path or a URL): temporary file, fsync,
    checksum sidecar, rename (:func:`hookloop.checkpoint.gate.write_file`). CheckpointError on
    I/O failure (the previous checkpoint at ``path`` is kept). The finite check is the
    caller's (it knows the run's baseline)."""
    gate.write_file(path, lambda file: torch.save(checkpoint, file), 'checkpoint')


def write_checkpoint(checkpoint, path, pointer_dir=None):
    """Save ``checkpoint`` to ``path`` atomically (with its checksum sidecar), then (with
    ``pointer_dir``) move that directory's ``last_checkpoint`` pointer to it: the order
    that keeps the pointer valid. The asynchronous writer runs this same sequence."""
    save_checkpoint(checkpoint, path)
    if pointer_dir is not None:
        update_pointer(pointer_dir, path)


def remove_checkpoint(path):
    """Delete a checkpoint (a file, or an FSDP directory of shards) and its checksum."""
    if storage.is_url(path):
        for victim in (path,) + tuple(path + suffix for suffix in CHECKSUM_SUFFIXES):
            if storage.exists(victim):
                storage.remove(victim)
        return
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    for suffix in CHECKSUM_SUFFIXES:
        if os.path.exists(path + suffix):
            os.remove(path + suffix)


# -- the pointer to the latest checkpoint ---------------------------------------------------

def _url_normpath(url):
    return storage.normpath(url)


def inside(path, directory):
    """True when ``path`` lies inside ``directory``: for local paths after resolving
    symlinks; for URLs when the posix-normalised path starts with ``directory + '/'``
    (a URL is never inside a local directory, nor the other way round)."""
    path, directory = os.fspath(path), os.fspath(directory)
    if storage.is_url(path) or storage.is_url(directory):
        if not (storage.is_url(path) and storage.is_url(directory)):
            return False
        path, directory = _url_normpath(path), _url_normpath(directory).rstrip('/')
        return path == directory or path.startswith(directory + '/')
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def update_pointer(work_dir, checkpoint_path):
    """Point ``<work_dir>/last_checkpoint`` at ``checkpoint_path`` (atomically).

    A checkpoint inside the work dir (the storage dir: a local path or a URL) is stored
    relative to it (a plain file name like ``iter_10.pth``), so a copied or moved work dir
    names its own files; only a checkpoint hook's explicit outside ``out_dir`` is stored as
    an absolute path (or a full URL). Called only after the checkpoint itself is renamed
    into place, so the pointer always names a complete file."""
    work_dir = os.fspath(work_dir)
    pointer = storage.join(work_dir, POINTER_NAME)
    if storage.is_url(checkpoint_path) or storage.is_url(work_dir):
        target = storage.normalize(checkpoint_path) if storage.is_url(checkpoint_path) else os.path.abspath(checkpoint_path)
        if inside(target, work_dir):
            target = storage.relpath(target, work_dir)
    else:
        target = os.path.abspath(checkpoint_path)
        if inside(target, work_dir):
            target = os.path.relpath(os.path.realpath(target), os.path.realpath(work_dir))
    try:
        atomic.atomic_write(pointer, lambda f: f.write(target.encode()))
    except OSError as exc:
        raise CheckpointError(f'could not update {pointer}: {io_reason(exc)}; '
                              'it still names the previous checkpoint') from exc


def read_pointer(work_dir, also_inside=()):
    """The checkpoint path the pointer names (absolute), or None when there is no pointer.

    CheckpointError when the pointer is damaged (not a file, not UTF-8, empty) or names a
    path outside the work dir (and outside the directories ``also_inside``, a checkpoint
    hook's own ``out_dir``): a pointer never leads a run into another run's files."""
    work_dir = os.fspath(work_dir)
    pointer = storage.join(work_dir, POINTER_NAME)
    url = storage.is_url(work_dir)
    if not (storage.exists(pointer) if url else os.path.lexists(pointer)):
        return None
    try:
        if url:
            if storage.isdir(pointer):
                raise IsADirectoryError(pointer)
            raw = storage.read_bytes(pointer)[:4097]
        else:
            with open(pointer, 'rb') as f:
                raw = f.read(4097)
        text = raw.decode('utf-8').strip()
    except IsADirectoryError:
        raise CheckpointError(f'{pointer} is a directory, not a pointer file') from None
    except UnicodeDecodeError:
        raise CheckpointError(f'{pointer} is damaged: not UTF-8 text') from None
    except OSError as exc:
        raise CheckpointError(f'cannot read {pointer}: {io_reason(exc)}') from None
    if not text or '\n' in text or '\0' in text or len(raw) > 4096:
        raise CheckpointError(f'{pointer} is damaged: it should hold one checkpoint path')
    if url or storage.is_url(text):  # a URL work dir, or a pointer to a checkpoint hook's URL out_dir
        joined = storage.join(work_dir, text)
        if storage.is_url(joined) and storage.dot_segments(joined):  # object keys are literal: never folded
            raise CheckpointError(f'{pointer} names {text!r}, with "." or ".." segments: refusing it (object '
                                  'store keys are literal)')
        path = storage.resolve(work_dir, text)
    else:
        path = os.path.normpath(os.path.join(os.path.abspath(work_dir), text))
    if not any(inside(path, d) for d in (work_dir, *also_inside)):
        raise CheckpointError(f'{pointer} names {text!r}, outside the work dir {work_dir!r}; refusing to follow '
                              'it into another run (resume from that file explicitly with resume_from=PATH)')
    return path


def safetensors_bytes(state_dict):
    """The bytes of a ``.safetensors`` file holding the tensors of ``state_dict`` (weights only,
    no code, no pickle)."""
    try:
        from safetensors.torch import save as to_bytes
    except ImportError:
        raise CheckpointError('safetensors export needs the safetensors package (pip install safetensors)') from None
    sparse = sorted(key for key, value in state_dict.items() if getattr(value, 'layout', torch.strided) != torch.strided)
    if sparse:
        raise CheckpointError(f'safetensors holds dense tensors only, and {sparse[:3]} are sparse: export these weights '
                              'with a checkpoint (.pth) instead')
    # safetensors refuses shared or non-contiguous storage; a private contiguous copy
    # of each tensor is what a weights file should hold anyway.
    return to_bytes({key: value.detach().to('cpu').contiguous().clone() for key, value in state_dict.items()
                     if hasattr(value, 'detach')})


def load_checkpoint(path, map_location='cpu', verify=True):
    """Load a checkpoint (a local path or a URL) with ``weights_only=True``; anything else
    is a CheckpointError.

    With ``verify`` the file is compared with every sidecar beside it (``.xxh128``, ``.sha256``;
    :mod:`hookloop.checkpoint.checksum`'s rules), in the same read that loads it; a mismatch is a
    CheckpointError, also when the damage makes the file unloadable."""
    if not storage.exists(path):
        raise CheckpointError(f'checkpoint {path!r} does not exist')
    if storage.isdir(path):
        raise CheckpointError(f'checkpoint {path!r} is a directory, not a checkpoint file')
    if storage.size(path) == 0:
        raise CheckpointError(f'checkpoint {path!r} is empty (0 bytes): not a checkpoint')
    expected = checksum.expected_checksums(path) if verify else []
    if not expected:
        source = io.BytesIO(storage.read_bytes(path)) if storage.is_url(path) else path
        return _torch_load(source, path, map_location)
    algorithms = tuple(algorithm for algorithm, _, _ in expected)
    if storage.is_url(path):  # one read of the object, hashed in memory
        data = storage.read_bytes(path)
        checksum.compare(path, expected, hashing.digest_bytes(data, algorithms))
        return _torch_load(io.BytesIO(data), path, map_location)
    with open(path, 'rb') as file:  # hashed as torch reads it: no second read for the checksum
        reader = hashing.HashingReader(file, algorithms)
        try:
            checkpoint = _torch_load(reader, path, map_location)
        except CheckpointError:  # a damaged file says it is damaged, as a check before loading would
            checksum.compare(path, expected, reader.finish())
            raise
        checksum.compare(path, expected, reader.finish())
    return checkpoint


def _torch_load(source, path, map_location):
    """``torch.load(source, weights_only=True)``, anything else a CheckpointError naming ``path``."""
    try:
        checkpoint = torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r'GLOBAL (\S+)', str(exc))
        if found is None:  # random bytes, not a pickle that asks for code
            raise CheckpointError(f'{path!r} is not a checkpoint (it cannot be unpickled)') from None
        raise CheckpointError(f'refusing to load {path!r}: it holds objects that would need arbitrary code to '
                              f'unpickle (it references {found.group(1)}); hookloop loads checkpoints with '
                              'weights_only=True only') from None
    except Exception as exc:  # torch raises many kinds for a file that is not a checkpoint
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f'{path!r} is not a readable checkpoint (truncated or not a checkpoint): '
                              f'{first}') from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f'{path!r} is not a hookloop checkpoint (got {type(checkpoint).__name__})')
    return checkpoint
