"""How a checkpoint's digest is computed, written and verified: in the pass that moves its bytes.

A save hashes the bytes as ``torch.save`` writes them (:class:`HashingWriter`); a verified load
hashes them as ``torch.load`` reads them (:class:`HashingReader`), so neither reads the file a
second time for its checksum. The hash is XXH3-128 (the ``xxhash`` package, ``pip install
hookloop[fast]``) when it can be imported, else SHA-256 (``hashlib``). The sidecar beside a
file names the algorithm in its suffix and holds one line in the ``*sum`` tools' format
(``<hex>  <name>``): ``iter_5.pth.xxh128`` (``xxh128sum -c`` checks it) or
``iter_5.pth.sha256`` (``sha256sum -c``); sidecars written by earlier versions (``.sha256``)
keep verifying.

What a digest means and when a missing one is an error is the checkpoint module's business
(:mod:`hookloop.checkpoint.format`); this module only computes, formats and parses them.
"""
import hashlib
import io

try:
    import xxhash
except ImportError:  # optional: SHA-256 then
    xxhash = None

CHUNK = 1 << 22
# algorithm -> (sidecar suffix, name in messages); the order is the preference
SUFFIXES = {'xxh128': '.xxh128', 'sha256': '.sha256'}
NAMES = {'xxh128': 'XXH128', 'sha256': 'SHA-256'}
PIECE = 1 << 18  # a large read is made and hashed by pieces of this size (L2-sized)
GAP = 1 << 16  # bytes a reader skips that are hashed at once (larger gaps wait for the end)


PACKAGES = {'xxh128': 'xxhash'}  # algorithm -> the package that computes it (hashlib's are always there)


def available(algorithm):
    return algorithm == 'sha256' or (algorithm == 'xxh128' and xxhash is not None)


def default_algorithm():
    """The algorithm new sidecars use: XXH3-128 when ``xxhash`` is installed, else SHA-256."""
    return 'xxh128' if xxhash is not None else 'sha256'


class Digests:
    """Several hashes fed the same bytes: ``hexdigest()`` is ``{algorithm: hex digest}``."""

    def __init__(self, algorithms):
        self._hashes = {algorithm: new_hash(algorithm) for algorithm in algorithms}

    def update(self, data):
        for digest in self._hashes.values():
            digest.update(data)

    def hexdigest(self):
        return {algorithm: digest.hexdigest() for algorithm, digest in self._hashes.items()}


def new_hash(algorithm):
    """A hash object for ``algorithm``; for a tuple of algorithms a :class:`Digests`."""
    if isinstance(algorithm, tuple):
        return Digests(algorithm)
    if algorithm == 'xxh128':
        if xxhash is None:
            raise ImportError('the xxhash package is not installed (pip install xxhash)')
        return xxhash.xxh3_128()
    if algorithm == 'sha256':
        return hashlib.sha256()
    raise ValueError(f'unknown checksum algorithm {algorithm!r}; known: {list(SUFFIXES)}')


def sidecar_line(digest, name):
    """The sidecar's content: ``<hex>  <name>\\n`` (what ``sha256sum`` / ``xxh128sum`` print)."""
    return f'{digest}  {name}\n'.encode()


def parse_sidecar(data):
    """``(hex digest, file name)`` of a sidecar's bytes: one line ``<hex>  <name>`` (or
    ``<hex> *<name>``, the ``*sum`` tools' binary mode); ValueError when it is not one."""
    lines = data.decode('utf-8').splitlines()
    if len(lines) != 1:
        raise ValueError('a sidecar holds one line')
    digest, _, name = lines[0].partition(' ')
    int(digest, 16)
    name = name[1:] if name.startswith((' ', '*')) else name
    if not name:
        raise ValueError('the sidecar names no file')
    return digest.lower(), name


def digest_stream(file, algorithm, chunk=CHUNK):
    """Hex digest of what is left to read of a binary file object (``{algorithm: hex}`` for a tuple)."""
    digest = new_hash(algorithm)
    for block in iter(lambda: file.read(chunk), b''):
        digest.update(block)
    return digest.hexdigest()


def digest_bytes(data, algorithm):
    digest = new_hash(algorithm)
    digest.update(data)
    return digest.hexdigest()


class HashingWriter(io.RawIOBase):
    """A write-only file object over ``file`` that hashes every byte written, in order.
    ``hexdigest()`` is the digest of all of them; ``flush``/``fileno`` reach ``file``."""

    def __init__(self, file, algorithm):
        super().__init__()
        self._file, self._hash, self.algorithm = file, new_hash(algorithm), algorithm
        self._count = 0

    def writable(self):
        return True

    def write(self, data):
        self._hash.update(data)
        written = self._file.write(data)
        size = len(data) if not isinstance(data, memoryview) else data.nbytes
        if written is not None and written != size:  # a short write: the hash saw more than the file
            raise OSError(f'short write ({written} of {size} bytes)')
        self._count += size
        return size

    def tell(self):
        return self._count

    def flush(self):
        self._file.flush()

    def fileno(self):
        return self._file.fileno()

    def hexdigest(self):
        return self._hash.hexdigest()


class HashingReader(io.RawIOBase):
    """A read-only, seekable file object over the binary file ``file`` that hashes every byte
    of it exactly once, in order, as a reader such as ``torch.load`` reads it.

    Reads that continue where the hash stands are hashed as they pass; a reader's short skip
    forward (a zip header's padding) is read and hashed at once; a long jump (``torch.load``
    reads the zip directory at the end first) is left for later, when the reader comes back
    to it or when :meth:`finish` reads what the reader never read in order. So a file read
    front to back is read once, and ``finish()`` gives the digest of the whole file."""

    def __init__(self, file, algorithm):
        super().__init__()
        self._file, self._hash, self.algorithm = file, new_hash(algorithm), algorithm  # (a tuple: several)
        self._hashed = 0                      # bytes [0, _hashed) are in the hash
        self._pos = file.tell()

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        self._pos = self._file.seek(offset, whence)
        return self._pos

    def readinto(self, buffer):
        view = memoryview(buffer).cast('B')
        total = 0
        while total < len(view):  # by pieces, each hashed while it is still in the CPU's cache
            start = self._pos
            count = self._file.readinto(view[total:total + PIECE])
            if not count:
                break
            self._pos = start + count
            self._absorb(start, view[total:total + count])
            total += count
        return total

    def read(self, size=-1):
        start = self._pos
        data = self._file.read(size)
        if data:
            self._pos = start + len(data)
            self._absorb(start, data)
        return data

    def _absorb(self, start, data):
        end = start + len(data)
        if end <= self._hashed:
            return
        if start > self._hashed:
            if start - self._hashed > GAP:
                return  # a jump ahead: hashed when the reader comes back, or by finish()
            self._fill(start)
        self._hash.update(data[self._hashed - start:])
        self._hashed = end

    def _fill(self, until):
        """Hash the bytes from where the hash stands up to ``until`` (restoring the position)."""
        self._file.seek(self._hashed)
        while self._hashed < until:
            block = self._file.read(min(CHUNK, until - self._hashed))
            if not block:
                break
            self._hash.update(block)
            self._hashed += len(block)
        self._file.seek(self._pos)

    def finish(self):
        """Hash whatever the reader did not read in order, to the end of the file; the hex digest
        (``{algorithm: hex}`` for a tuple of algorithms)."""
        self._file.seek(self._hashed)
        for block in iter(lambda: self._file.read(CHUNK), b''):
            self._hash.update(block)
            self._hashed += len(block)
        self._file.seek(self._pos)
        return self._hash.hexdigest()


__all__ = ['SUFFIXES', 'NAMES', 'PACKAGES', 'Digests', 'available', 'default_algorithm', 'new_hash', 'sidecar_line', 'parse_sidecar',
           'digest_stream', 'digest_bytes', 'HashingWriter', 'HashingReader']
