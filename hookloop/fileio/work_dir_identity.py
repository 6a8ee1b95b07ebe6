"""One identity for a work dir, whatever its spelling: two runs that would write to the same
place take the same lock.

A local directory can be spelled as a path (relative, with ``..``, through a symlink) or as a
``file:`` / ``local:`` URL (``file:///DIR``, ``file://localhost/DIR``, RFC 8089's ``file:/DIR``,
fsspec's ``local:///DIR``); :func:`resolve_location` turns each into the absolute local path, and
the lock lives in its real path. An object-store prefix can be spelled with any protocol alias
fsspec maps to the same filesystem class (``s3://`` / ``s3a://``, ``gs://`` / ``gcs://``, ...)
and, for S3, Hadoop's ``s3n://``: it is rewritten to the class's first protocol (``s3://B/run``),
so one fsspec configuration applies, and :func:`lock_identity` names the store by its endpoint.

A spelling with no single meaning is refused in one line, never guessed: ``file://HOST/DIR``
with another host, a relative ``file:DIR`` / ``local://DIR``, percent-escapes, a query or a
fragment, chained URLs (``simplecache::s3://...``).
"""
import os
import re

from ..errors import ConfigError

_LOCAL_URL = re.compile(r'^(file|local):(.*)$', re.IGNORECASE | re.DOTALL)
_PROTOCOL_ALIASES = {'s3n': 's3'}  # Hadoop's names fsspec does not know


def _refuse(spelling, what, why):
    raise ConfigError(f'{what} {spelling!r} {why}: give it as a local path or a plain URL (s3://bucket/prefix)')


def local_path_of(spelling, what='work_dir'):
    """The absolute local path a ``file:`` / ``local:`` URL names; None for any other spelling."""
    found = _LOCAL_URL.match(spelling)
    if found is None:
        return None
    rest = found.group(2)
    if rest.startswith('//'):
        host, _, path = rest[2:].partition('/')
        if host.lower() not in ('', 'localhost'):
            _refuse(spelling, what, f'names the host {host!r} (or a relative path, which a {found.group(1)}: URL '
                    'cannot hold)')
        path = '/' + path
    elif rest.startswith('/'):
        path = rest
    else:
        _refuse(spelling, what, 'is a relative file URL')
    if any(c in path for c in '%?#'):
        _refuse(spelling, what, 'holds a percent-escape, a query or a fragment, which hookloop does not decode')
    return os.path.normpath('/' + path.lstrip('/'))


def resolve_location(spelling, what='work_dir'):
    """``spelling`` as hookloop writes to it: an absolute local path, or a URL with the
    canonical protocol of its filesystem (``s3a://b/run`` -> ``s3://b/run``)."""
    spelling = os.fspath(spelling)
    local = local_path_of(spelling, what)
    if local is not None:
        return local
    if '::' in spelling:
        _refuse(spelling, what, 'chains filesystems')
    if '://' not in spelling:
        return os.path.abspath(spelling)
    protocol, rest = spelling.split('://', 1)
    if any(c in rest for c in '?#'):
        _refuse(spelling, what, 'holds a query or a fragment')
    protocol = _PROTOCOL_ALIASES.get(protocol.lower(), protocol.lower())
    try:
        import fsspec
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return f'{protocol}://{rest}'  # storage.filesystem says what is missing, in one line
    names = cls.protocol if isinstance(cls.protocol, (tuple, list)) else (cls.protocol,)
    return f'{names[0]}://{rest}'


def lock_identity(location):
    """A string two spellings of one place share: the real path of a local directory, or
    ``protocol://store/path`` of a URL (``store``: the S3 endpoint it resolves to)."""
    from . import storage
    if not storage.is_url(location):
        return os.path.realpath(location)
    fs, inner = storage.filesystem(location)
    store = ''
    if location.startswith('s3://'):  # bucket names are unique per endpoint, not across them
        store = (fs.client_kwargs.get('endpoint_url') or getattr(fs, 'endpoint_url', None)
                 or os.environ.get('AWS_ENDPOINT_URL_S3') or os.environ.get('AWS_ENDPOINT_URL') or 'aws')
        store = store.rstrip('/').lower()
    return f'{location.split("://", 1)[0]}://{store}|{inner.strip("/")}'
