"""Checkpoint files: atomic writes, safe loads, the ``last_checkpoint`` pointer, RNG state.

A checkpoint is a dict of tensors and plain containers, so
``torch.load(weights_only=True)`` reads it and a stranger's file runs no code.
"""
import errno
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

from ..fileio import hashing
from ..fileio import storage
from ..errors import CheckpointError

POINTER_NAME = 'last_checkpoint'
TMP_SUFFIX = '.tmp'
CHECKSUM_SUFFIX = '.sha256'  # the SHA-256 sidecar (every sidecar before XXH128 came)
CHECKSUM_SUFFIXES = tuple(hashing.SUFFIXES.values())  # every kind of sidecar (see hookloop.fileio.hashing)


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask():
    # The only portable way to read the umask is to set it; put it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _reason(exc):
    """The OS's words for an I/O error ("No space left on device"), else the message."""
    return getattr(exc, 'strerror', None) or str(exc).strip().splitlines()[0]


# -- the save path, one step per function (the async saver reuses them) -------------------

def write_temporary(path, write):
    """Call ``write(file)`` on a new temporary file beside ``path``, flush and fsync it;
    return the temporary's path. The file gets the permissions ``open()`` would give
    (``0o666`` less the umask), not ``mkstemp``'s private 0600. On error it is removed.

    For a URL the temporary is an object ``.<name>.<random>.tmp`` beside ``path``
    (see :func:`hookloop.fileio.storage.write_temporary_url`)."""
    if storage.is_url(path):
        return storage.write_temporary_url(path, write)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix=TMP_SUFFIX, dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, 'wb') as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        discard(tmp_path)
        raise
    return tmp_path


def discard(tmp_path):
    if storage.is_url(tmp_path):
        return storage.remove_quietly(tmp_path)
    try:
        os.unlink(tmp_path)
    except OSError:
        pass


def file_checksum(path, chunk=1 << 22, algorithm='sha256'):
    """The digest of a file's bytes (SHA-256 unless ``algorithm`` says otherwise), as hex."""
    with storage.open_read(path) as f:
        return hashing.digest_stream(f, algorithm, chunk)


def checksum_path(path, algorithm=None):
    """The sidecar of ``path`` for ``algorithm`` (default: the one new checkpoints get,
    :func:`hookloop.fileio.hashing.default_algorithm`): ``<path>.xxh128`` or ``<path>.sha256``."""
    return path + hashing.SUFFIXES[algorithm or hashing.default_algorithm()]


def find_checksum(path):
    """``(algorithm, sidecar path)`` of the sidecar beside ``path``, or None when it has none.
    The current algorithm's sidecar is looked for first."""
    first = hashing.default_algorithm()
    for algorithm in [first] + [a for a in hashing.SUFFIXES if a != first]:
        sidecar = path + hashing.SUFFIXES[algorithm]
        if storage.isfile(sidecar):
            return algorithm, sidecar
    return None


def write_checksum(path, digest, algorithm='sha256'):
    """The sidecar ``checksum_path(path, algorithm)``, ``<hex>  <name>`` as ``sha256sum`` /
    ``xxh128sum`` write it (``-c`` checks it), atomically.

    Written *before* the checkpoint is renamed into place: a kill between the two leaves
    a checksum for a file that is not there yet, never a checkpoint without its checksum."""
    sidecar = checksum_path(path, algorithm)
    line = hashing.sidecar_line(digest, storage.basename(path))
    commit(write_temporary(sidecar, lambda f: f.write(line)), sidecar)


def _remove_other_checksums(path, algorithm):
    """After a save with ``algorithm``: drop the sidecars an earlier file at ``path`` had."""
    for other, suffix in hashing.SUFFIXES.items():
        if other != algorithm and storage.isfile(path + suffix):
            try:
                if storage.is_url(path):
                    storage.remove(path + suffix)
                else:
                    os.remove(path + suffix)
            except OSError:
                pass


class DirectorySyncError(CheckpointError):
    """The rename succeeded (the new file is in place) but the directory's fsync failed."""


def commit(tmp_path, path):
    """Rename the finished temporary over ``path`` (atomic on POSIX) and fsync the directory.
    For a URL the temporary object is moved to ``path`` (see :mod:`hookloop.fileio.storage`)."""
    if storage.is_url(path):
        try:
            storage.move(tmp_path, path)
        except BaseException:
            discard(tmp_path)
            raise
        return
    try:
        os.replace(tmp_path, path)
    except BaseException:
        discard(tmp_path)
        raise
    try:
        _fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:  # after the rename: the new file is in place, not the previous one
        raise DirectorySyncError(f'{path} was written and renamed into place, but syncing its directory failed '
                              f'({_reason(exc)}): it may not survive a crash of the machine') from exc


def atomic_write(path, write):
    """Call ``write(file)`` on a temporary file (or object, for a URL) beside ``path``,
    fsync it, rename (move) it to ``path``. On any error the temporary is removed and
    ``path`` is untouched."""
    commit(write_temporary(path, write), path)


def save_checkpoint(checkpoint, path):
    """Write ``checkpoint`` to ``path`` (a local path or a URL): temporary file, fsync,
    checksum sidecar, rename. CheckpointError on I/O failure (the previous file at ``path``
    is kept)."""
    algorithm, digest = hashing.default_algorithm(), []

    def write(file):  # the checksum is computed as the bytes are written: no second read
        hashed = hashing.HashingWriter(file, algorithm)
        torch.save(checkpoint, hashed)
        digest.append(hashed.hexdigest())

    try:
        tmp_path = write_temporary(path, write)
        synced = None
        try:
            write_checksum(path, digest[0], algorithm)
        except DirectorySyncError as exc:  # the new sidecar is in place: the checkpoint must join it
            synced = exc
        except BaseException:
            discard(tmp_path)
            raise
        commit(tmp_path, path)
        _remove_other_checksums(path, algorithm)
        if synced is not None:
            raise DirectorySyncError(f'{path} was written and renamed into place, but syncing its directory failed '
                                     f'({_reason(synced.__cause__)}): it may not survive a crash of the machine')
    except (OSError, RuntimeError) as exc:  # torch's zip writer reports a failed write as RuntimeError
        # ("enforce fail ... unexpected pos"), with the file's OSError (ENOSPC, EIO) as its context
        reason = _reason(exc.__context__ if isinstance(exc, RuntimeError) and isinstance(exc.__context__, OSError)
                         else exc)
        if isinstance(exc, RuntimeError) and 'No space left' not in reason and _disk_full(path):
            reason = os.strerror(errno.ENOSPC)
        raise CheckpointError(f'could not write checkpoint {path}: {reason}; '
                              'the previous checkpoint is kept') from exc


def _disk_full(path):
    if storage.is_url(path):
        return False
    try:
        stats = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return stats.f_bavail == 0


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


def verify_checksum(path):
    """Compare ``path`` with its sidecar (``.xxh128`` or ``.sha256``). Returns False when there
    is no sidecar (a file hookloop did not write, e.g. a plain ``torch.save``); CheckpointError
    on a mismatch. :func:`load_checkpoint` verifies while it reads instead."""
    expected = _expected_checksum(path)
    if expected is None:
        return False
    algorithm, sidecar, digest = expected
    _compare(path, sidecar, algorithm, digest, file_checksum(path, algorithm=algorithm))
    return True


def _expected_checksum(path):
    """``(algorithm, sidecar, hex digest)`` from the sidecar of ``path``, None without one."""
    found = find_checksum(path)
    if found is None:
        return None
    algorithm, sidecar = found
    try:
        digest = hashing.parse_sidecar(storage.read_bytes(sidecar))
    except (OSError, IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f'{sidecar!r}, the checksum of {path!r}, is damaged') from None
    if not hashing.available(algorithm):
        raise CheckpointError(f'{path!r} has an {hashing.NAMES[algorithm]} checksum ({storage.basename(sidecar)}) '
                              'and the xxhash package is not installed to check it: pip install xxhash '
                              '(or load it with verify=False)')
    return algorithm, sidecar, digest


def _compare(path, sidecar, algorithm, expected, actual):
    if actual != expected:
        raise CheckpointError(f'{path!r} is damaged: its {hashing.NAMES[algorithm]} does not match '
                              f'{storage.basename(sidecar)} (changed or corrupted after it was written)')


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
        atomic_write(pointer, lambda f: f.write(target.encode()))
    except OSError as exc:
        raise CheckpointError(f'could not update {pointer}: {_reason(exc)}; '
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
        raise CheckpointError(f'cannot read {pointer}: {_reason(exc)}') from None
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


def remove_stale_temporaries(directory):
    """Delete ``.<name>.<random>.tmp`` files that a killed writer left in ``directory``.

    Only rank 0 of the run that owns ``directory`` (it holds the work dir's lock) calls this."""
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
    try:
        atomic_write(path, lambda f: f.write(safetensors_bytes(tensors)))
    except OSError as exc:
        raise CheckpointError(f'could not write {path}: {getattr(exc, "strerror", None) or exc}') from exc


def load_checkpoint(path, map_location='cpu', verify=True):
    """Load a checkpoint (a local path or a URL) with ``weights_only=True``; anything else
    is a CheckpointError.

    With ``verify`` the file is compared with its sidecar (``.xxh128`` or ``.sha256``) when it
    has one, in the same read that loads it; a mismatch is a CheckpointError, also when the
    damage makes the file unloadable."""
    if not storage.exists(path):
        raise CheckpointError(f'checkpoint {path!r} does not exist')
    if storage.isdir(path):
        raise CheckpointError(f'checkpoint {path!r} is a directory, not a checkpoint file')
    if storage.size(path) == 0:
        raise CheckpointError(f'checkpoint {path!r} is empty (0 bytes): not a checkpoint')
    expected = _expected_checksum(path) if verify else None
    if expected is None:
        source = io.BytesIO(storage.read_bytes(path)) if storage.is_url(path) else path
        return _torch_load(source, path, map_location)
    algorithm, sidecar, digest = expected
    if storage.is_url(path):  # one read of the object, hashed in memory
        data = storage.read_bytes(path)
        _compare(path, sidecar, algorithm, digest, hashing.digest_bytes(data, algorithm))
        return _torch_load(io.BytesIO(data), path, map_location)
    with open(path, 'rb') as file:  # hashed as torch reads it: no second read for the checksum
        reader = hashing.HashingReader(file, algorithm)
        try:
            checkpoint = _torch_load(reader, path, map_location)
        except CheckpointError:  # a damaged file says it is damaged, as a check before loading would
            _compare(path, sidecar, algorithm, digest, reader.finish())
            raise
        _compare(path, sidecar, algorithm, digest, reader.finish())
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
