"""Checkpoint storage on a local disk or behind an fsspec URL (``s3://``, ``gs://``, ``memory://``...).

Every function takes a local path or a URL; a local path goes to ``os``, a URL to the
fsspec filesystem of its protocol. Credentials and endpoints come from fsspec's own
configuration: ``FSSPEC_S3_ENDPOINT_URL=http://127.0.0.1:9000``, ``AWS_ACCESS_KEY_ID``, ...,
or ``fsspec.config.conf['s3'] = {...}``.

Object stores have no atomic rename, but an object becomes visible only once it is fully
uploaded; a checkpoint is still written to a temporary key first and then moved (copied) to
its name, and the ``last_checkpoint`` pointer is written last, so a reader that follows the
pointer never sees a half-written checkpoint.
"""
import os
import posixpath
import uuid

import functools

from ..errors import CheckpointError, ConfigError

TMP_SUFFIX = '.tmp'
# Packages whose own exception classes an fsspec filesystem lets through (botocore's
# EndpointConnectionError when the S3 server goes away, ...): turned into StorageError.
_CLIENT_PACKAGES = ('botocore', 'aiobotocore', 'aiohttp', 'urllib3', 'requests', 'google', 'gcsfs', 's3fs',
                    'adlfs', 'azure', 'fsspec')


class StorageError(CheckpointError, OSError):
    """The store behind a URL failed (unreachable, refused): one line, and an OSError, so a
    save reports it like a local I/O error (the previous checkpoint is kept)."""


def _store_errors(function):
    """Re-raise a storage client's own exception as a one-line :class:`StorageError`."""
    @functools.wraps(function)
    def call(path, *args, **kwargs):
        try:
            return function(path, *args, **kwargs)
        except Exception as exc:
            package = type(exc).__module__.split('.')[0]
            if isinstance(exc, (OSError, CheckpointError, ConfigError)) or package not in _CLIENT_PACKAGES:
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StorageError(f'storage {path!r} failed: {first} ({type(exc).__name__})') from exc
    return call


def is_url(path):
    """True for ``protocol://...`` (``file://`` included); False for plain local paths."""
    return isinstance(path, str) and '://' in path


def filesystem(url):
    """``(fsspec filesystem, path inside it)`` for ``url``; a ConfigError in one line when
    the protocol is unknown or its package is missing."""
    import fsspec
    from fsspec.core import url_to_fs
    protocol = url.split('://', 1)[0]
    try:
        return url_to_fs(url)
    except ValueError as exc:
        if 'Protocol not known' in str(exc):
            known = ', '.join(sorted(p for p in fsspec.available_protocols() if len(p) > 1)[:12])
            raise ConfigError(f'{url!r}: unknown storage protocol {protocol!r} (fsspec knows e.g. {known})') from None
        raise ConfigError(f'{url!r}: {exc}') from None
    except ImportError as exc:
        raise ConfigError(f'{url!r}: the {protocol!r} protocol needs a package that is not installed: '
                          f'{str(exc).splitlines()[0]}') from None


def join(base, name):
    """``name`` under ``base``; an absolute path or a URL ``name`` is returned as it is."""
    name = os.fspath(name)
    if is_url(name) or os.path.isabs(name):
        return name
    if is_url(base):
        return base.rstrip('/') + '/' + name
    return os.path.join(base, name)


def dot_segments(url):
    """True when ``url``'s path has a ``.`` or ``..`` segment: on an object store these are
    literal parts of a key (``s3://b/x/../run`` is not ``s3://b/run``), so hookloop refuses them."""
    return any(part in ('.', '..') for part in url.split('://', 1)[1].split('/'))


def check_url(url, what):
    """``url`` itself, or a ConfigError when it has ``.``/``..`` segments (see :func:`dot_segments`)."""
    if is_url(url) and dot_segments(url):
        raise ConfigError(f'{what} {url!r} has "." or ".." in its path: on an object store those are literal '
                          'parts of a key, not directories; give the URL without them')
    return url


def normpath(path):
    """``path`` with ``..`` and doubled slashes folded; for a URL doubled slashes only (a
    URL with ``.``/``..`` segments is a ConfigError: keys are literal, never folded)."""
    if not is_url(path):
        return os.path.normpath(path)
    check_url(path, 'storage path')
    protocol, rest = path.split('://', 1)
    return protocol + '://' + posixpath.normpath(rest or '.')


def relpath(path, base):
    """``path`` relative to ``base`` (both local, or both URLs)."""
    if is_url(path) and is_url(base):
        return posixpath.relpath(normpath(path).split('://', 1)[1], normpath(base).split('://', 1)[1])
    return os.path.relpath(path, base)


def resolve(base, name):
    """``name`` under ``base``, normalised (for a URL: never with ``..``, see :func:`normpath`)."""
    return normpath(join(base, name))


def dirname(path):
    return posixpath.dirname(path.rstrip('/')) if is_url(path) else os.path.dirname(path)


def normalize(path):
    """A form of ``path`` two spellings of the same place compare equal in."""
    return path.rstrip('/') if is_url(path) else os.path.abspath(path)


@_store_errors
def makedirs(path):
    if not is_url(path):
        os.makedirs(path, exist_ok=True)
        return
    fs, inner = filesystem(path)
    fs.makedirs(inner, exist_ok=True)


@_store_errors
def _test(path, local_test, remote_test):
    """``local_test(path)`` for a local path; for a URL the filesystem's own test, on a fresh
    listing (another process may have written there since we last listed)."""
    if not is_url(path):
        return local_test(path)
    fs, inner = filesystem(path)
    fs.invalidate_cache(inner)
    return getattr(fs, remote_test)(inner)


def exists(path):
    return _test(path, os.path.exists, 'exists')


def isfile(path):
    return _test(path, os.path.isfile, 'isfile')


def isdir(path):
    return _test(path, os.path.isdir, 'isdir')


@_store_errors
def read_bytes(path):
    if not is_url(path):
        with open(path, 'rb') as f:
            return f.read()
    fs, inner = filesystem(path)
    return fs.cat_file(inner)


def basename(path):
    return posixpath.basename(path.rstrip('/')) if is_url(path) else os.path.basename(path)


@_store_errors
def size(path):
    if not is_url(path):
        return os.path.getsize(path)
    fs, inner = filesystem(path)
    return fs.size(inner)


@_store_errors
def open_read(path):
    """A binary file object for reading ``path``."""
    if not is_url(path):
        return open(path, 'rb')
    fs, inner = filesystem(path)
    return fs.open(inner, 'rb')


@_store_errors
def listdir(path):
    """Names (not paths) of the entries directly under ``path``; [] when it does not exist."""
    if not is_url(path):
        return os.listdir(path) if os.path.isdir(path) else []
    fs, inner = filesystem(path)
    fs.invalidate_cache(inner)
    try:
        entries = fs.ls(inner, detail=False)
    except FileNotFoundError:
        return []
    return [posixpath.basename(e.rstrip('/')) for e in entries if e.rstrip('/') != inner.rstrip('/')]


@_store_errors
def mtime(path):
    """Modification time in seconds, 0 when the store does not say."""
    if not is_url(path):
        return os.path.getmtime(path)
    fs, inner = filesystem(path)
    try:
        modified = fs.modified(inner)
    except (NotImplementedError, OSError, AttributeError):
        return 0.0
    return modified.timestamp() if hasattr(modified, 'timestamp') else float(modified or 0)


def remove_quietly(url):
    """Delete ``url`` if it exists; errors are ignored (the store may be what failed)."""
    try:
        fs, inner = filesystem(url)
        if fs.exists(inner):
            fs.rm(inner)
    except Exception:  # noqa: BLE001
        pass


@_store_errors
def write_temporary_url(url, write):
    """Call ``write(file)`` on a new temporary object ``.<name>.<random>.tmp`` beside ``url``
    and return the temporary's URL (to :func:`move` into place). On error it is removed."""
    fs, inner = filesystem(url)
    directory, name = posixpath.split(inner.rstrip('/'))
    tmp_inner = posixpath.join(directory, f'.{name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}')
    tmp_url = posixpath.join(dirname(url), posixpath.basename(tmp_inner))
    try:
        with fs.open(tmp_inner, 'wb') as file:
            write(file)
    except BaseException:
        remove_quietly(tmp_url)
        raise
    return tmp_url


@_store_errors
def move(source_url, target_url):
    """Move (copy, on an object store) ``source_url`` to ``target_url``."""
    fs, source = filesystem(source_url)
    _, target = filesystem(target_url)
    fs.mv(source, target)
    fs.invalidate_cache(posixpath.dirname(target.rstrip('/')))


@_store_errors
def remove(path):
    """Delete a file or a directory tree."""
    fs, inner = filesystem(path)
    fs.rm(inner, recursive=True)


@_store_errors
def write_atomic_url(url, write):
    """Call ``write(file)`` on a temporary object beside ``url``, then move it to ``url``.
    On any error the temporary object is removed and ``url`` is untouched."""
    fs, inner = filesystem(url)
    directory, name = posixpath.split(inner.rstrip('/'))
    tmp = posixpath.join(directory, f'.{name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}')
    try:
        with fs.open(tmp, 'wb') as file:
            write(file)
        fs.mv(tmp, inner)
    except BaseException:
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except Exception:  # the store may be what failed; the original error matters
            pass
        raise
    fs.invalidate_cache(directory)


@_store_errors
def remove_stale_temporaries_url(url):
    """Delete ``.<name>.<random>.tmp`` objects a killed writer left under ``url``."""
    fs, inner = filesystem(url)
    fs.invalidate_cache(inner)
    removed = []
    try:
        names = fs.ls(inner, detail=False)
    except FileNotFoundError:
        return removed
    for entry in names:
        base = posixpath.basename(entry.rstrip('/'))
        if base.startswith('.') and base.endswith(TMP_SUFFIX):
            fs.rm(entry)
            removed.append(url.rstrip('/') + '/' + base)
    return removed


def local_mirror(url):
    """The local directory for files that libraries write with plain ``open`` (the log, the
    JSON log, event files) during a run whose work dir is ``url``: the same directory for the
    same URL, so a resumed run continues the earlier run's files there.

    It lies in a private directory of this user (``<tmp>/hookloop-mirrors-<uid>``, mode 0700,
    checked to be a real directory owned by us): another user cannot plant a symlink or a
    file there. When that directory is not ours, a fresh ``mkdtemp`` directory is used."""
    import hashlib
    import stat
    import tempfile
    digest = hashlib.sha1(url.rstrip('/').encode()).hexdigest()[:12]
    base = os.path.join(tempfile.gettempdir(), f'hookloop-mirrors-{os.getuid()}')
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix=f'hookloop-mirror-{digest}-')
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return tempfile.mkdtemp(prefix=f'hookloop-mirror-{digest}-')
    return os.path.join(base, digest)


@_store_errors
def upload_tree(local_dir, url):
    """Copy the files under ``local_dir`` to ``url`` (logs at the end of a run)."""
    fs, inner = filesystem(url)
    for root, _, files in os.walk(local_dir):
        for name in files:
            if name.startswith('.'):
                continue
            relative = os.path.relpath(os.path.join(root, name), local_dir).replace(os.sep, '/')
            fs.put_file(os.path.join(root, name), posixpath.join(inner, relative))
