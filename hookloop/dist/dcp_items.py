"""Decoding what a sharded checkpoint stores per key, within bounds set before a byte is decoded.

DCP stores each tensor chunk and each plain value (an optimizer's ``lr``, ``betas``, the
``params`` names, ...: a *bytes item*) as a ``torch.save`` zip archive at an offset of a
shard file. A rigged archive can cost far more than its size: a deflated record inflates a
thousandfold, and a pickled dict whose integer keys share one hash takes minutes to build.
Here, before anything is decoded:

* the archive is parsed from its central directory and every record must be *stored*
  (``torch.save`` compresses nothing), its declared size inside the archive; a tensor slice's
  pickle is at most :data:`MAX_TENSOR_PICKLE` bytes (a tensor's is ~150);
* a bytes item is not handed to ``torch.load`` at all: its ``data.pkl`` is read by
  :class:`PlainValueUnpickler`, which names no class (``OrderedDict`` aside), loads no tensor,
  builds no set, accepts as dictionary keys only strings, booleans, ``None`` and integers below
  2**60 (whose hashes never collide) and stops after a number of opcodes set by the value this
  run expects at that key;
* the value is then compared with that expected value (:func:`check_matches`): ``lr`` stays a
  number, ``betas`` a pair of numbers, ``params`` a list of as many names; an optional setting
  may differ in being set (``foreach``: ``None`` here, ``True`` there, or back to ``None`` where
  this run has a flag).
"""
import io
import pickle
import zipfile

from ..errors import CheckpointError

MAX_TENSOR_PICKLE = 16 << 10
MAX_RECORDS = 64  # torch.save writes 5 to 7
ZIP_OVERHEAD = 8 << 10  # torch.save's records and 64-byte alignment around a small pickle
_SMALL_INT = 1 << 60
_MAX_INT_BYTES = 16
_SCALARS = ('none', 'bool', 'number', 'str', 'bytes')


def _nodes(value, limit=1 << 20):
    """How many values ``value`` holds (itself included), counted up to ``limit``."""
    count, todo = 0, [value]
    while todo and count < limit:
        item = todo.pop()
        count += 1
        if isinstance(item, (list, tuple)):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
    return count


def bytes_item_limit(expected):
    """The most bytes a bytes item may take when this run holds ``expected`` at its key."""
    try:
        size = len(pickle.dumps(expected, protocol=2))
    except Exception:  # noqa: BLE001 - an unpicklable value: give it the floor
        size = 0
    return ZIP_OVERHEAD + 16 * size


def check_zip(data, refuse, what):
    """The ``ZipFile`` over ``data`` once every record is stored uncompressed inside it."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        records = archive.infolist()
    except Exception:  # noqa: BLE001 - zipfile raises many kinds on rigged bytes
        refuse(f'{what} is not a torch.save archive')
    if len(records) > MAX_RECORDS:
        refuse(f'{what} is an archive of {len(records)} records (torch.save writes at most 7)')
    total = 0
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED:
            refuse(f'{what} holds a compressed record {record.filename!r:.60} (torch.save compresses nothing: '
                   'refusing to inflate it)')
        if record.file_size != record.compress_size or record.header_offset + record.file_size > len(data):
            refuse(f'{what} declares a record {record.filename!r:.60} larger than the archive')
        total += record.file_size
    if total > len(data):
        refuse(f'{what} declares records of {total} bytes in {len(data)}')
    return archive


def _pickle_record(archive, refuse, what):
    names = [r.filename for r in archive.infolist() if r.filename.endswith('/data.pkl') or r.filename == 'data.pkl']
    if len(names) != 1:
        refuse(f'{what} holds {len(names)} pickles, not one')
    try:
        return names[0], archive.read(names[0])
    except Exception as exc:  # noqa: BLE001 - a bad CRC or header
        refuse(f'{what} is damaged ({type(exc).__name__})')


def check_tensor_archive(data, refuse, what):
    """Refuse a tensor slice's archive with a compressed or oversized record or a pickle over
    :data:`MAX_TENSOR_PICKLE` bytes, before ``torch.load`` reads it."""
    archive = check_zip(data, refuse, what)
    for record in archive.infolist():
        if record.filename.endswith('/data.pkl') and record.file_size > MAX_TENSOR_PICKLE:
            refuse(f'{what} holds a pickle of {record.file_size} bytes (a tensor needs a few hundred)')


class PlainValueUnpickler(pickle._Unpickler):  # the Python implementation: each opcode is seen
    """Loads a pickle of plain values (None, bools, numbers, strings, bytes, lists, tuples,
    dicts) in at most ``budget`` opcodes; ``refuse(why)`` raises for anything else."""

    def __init__(self, file, budget, refuse):
        super().__init__(file)
        self.refuse = refuse
        self.budget = budget
        dispatch = {}
        for code, load in pickle._Unpickler.dispatch.items():
            dispatch[code] = self._counted(load)
        for opcode, load in ((pickle.SETITEM, self._load_setitem), (pickle.SETITEMS, self._load_setitems),
                             (pickle.INT, self._load_text_int), (pickle.LONG, self._load_text_int),
                             (pickle.LONG1, self._load_long1), (pickle.LONG4, self._load_long4)):
            dispatch[opcode[0]] = self._counted(load.__func__)
        for opcode in (pickle.EMPTY_SET, pickle.ADDITEMS, pickle.FROZENSET):
            dispatch[opcode[0]] = lambda _self: self.refuse('it builds a set (not a value the state holds)')
        self.dispatch = dispatch

    def _counted(self, load):
        def run(_self):
            self.budget -= 1
            if self.budget < 0:
                self.refuse('it holds far more values than this run has at that key')
            load(self)
        return run

    def find_class(self, module, name):
        if (module, name) == ('collections', 'OrderedDict'):
            return dict  # an ordered dict of plain values reads as a dict: keys checked the same way
        self.refuse(f'it names {module}.{name:.60} (a plain value names no class)')

    def persistent_load(self, pid):
        self.refuse('it holds a tensor where a plain value belongs')

    def _check_keys(self, keys):
        for key in keys:
            if key is None or isinstance(key, (str, bool)) or (type(key) is int and -_SMALL_INT < key < _SMALL_INT):
                continue
            self.refuse(f'it uses a {type(key).__name__} as a dictionary key (not one the state uses)')

    def _load_setitem(self):
        self._check_keys([self.stack[-2]])
        pickle._Unpickler.load_setitem(self)

    def _load_setitems(self):
        self._check_keys(self.stack[0::2])  # the items since the last MARK: key, value, ...
        pickle._Unpickler.load_setitems(self)

    def _refuse_long_int(self, n):
        if n > _MAX_INT_BYTES:
            self.refuse(f'it holds an integer of {n} bytes (the state holds none over {_MAX_INT_BYTES})')

    def _load_text_int(self):  # INT / LONG of protocol 0: int() of a long line is quadratic before 3.11
        line = self.readline()
        self._refuse_long_int(len(line) // 2)
        self.append(line == b'01\n' if line in (b'00\n', b'01\n') else int(line[:-1].rstrip(b'L'), 0))

    def _load_long1(self):
        n = self.read(1)[0]
        self._refuse_long_int(n)
        self.append(pickle.decode_long(self.read(n)))

    def _load_long4(self):
        n = int.from_bytes(self.read(4), 'little', signed=True)
        if n < 0:
            self.refuse('it is damaged (an integer of negative length)')
        self._refuse_long_int(n)
        self.append(pickle.decode_long(self.read(n)))


def _kind(value):
    if value is None:
        return 'none'
    if isinstance(value, bool):
        return 'bool'
    if isinstance(value, (int, float)):
        return 'number'
    if isinstance(value, (str, bytes)):
        return 'str' if isinstance(value, str) else 'bytes'
    if isinstance(value, (list, tuple)):
        return 'sequence'
    if isinstance(value, dict):
        return 'mapping'
    return type(value).__name__


def check_matches(value, expected, refuse, budget):
    """Refuse ``value`` unless it has the form of ``expected`` (see the module docstring),
    walking at most ``budget`` values (shared references are walked each time they occur)."""
    todo = [(value, expected, '')]
    while todo:
        budget -= 1
        if budget < 0:
            refuse('it holds far more values than this run has at that key')
        got, want, where = todo.pop()
        kinds = _kind(got), _kind(want)
        if kinds[0] == kinds[1] and kinds[0] in _SCALARS:
            continue
        if (kinds[1] == 'none' and kinds[0] in ('bool', 'number')) or (kinds[0] == 'none' and kinds[1] == 'bool'):
            continue  # an optional setting (foreach=None, fused=True) set in one run and not the other
        if kinds[0] != kinds[1]:
            refuse(f'it holds a {kinds[0]}{where} where this run has a {kinds[1]}')
        if kinds[0] == 'sequence':
            if len(got) != len(want):
                refuse(f'it holds {len(got)} values{where} where this run has {len(want)}')
            todo.extend((g, w, f'{where}[{i}]') for i, (g, w) in enumerate(zip(got, want)))
        elif kinds[0] == 'mapping':
            if set(got) != set(want):
                refuse(f'its keys{where} are not the {len(want)} this run has')
            todo.extend((got[k], w, f'{where}[{k!r:.40}]') for k, w in want.items())
        else:
            refuse(f'it holds a {kinds[0]}{where}, not a plain value')


def read_plain_value(data, expected, refuse, what):
    """The plain value stored in the bytes item ``data``, checked against ``expected``."""
    archive = check_zip(data, refuse, what)
    if any('/data/' in r.filename or r.filename.startswith('data/') for r in archive.infolist()):
        refuse('it holds a tensor where a plain value belongs')
    _, pickled = _pickle_record(archive, refuse, what)
    budget = 16 * _nodes(expected) + 256
    try:
        value = PlainValueUnpickler(io.BytesIO(pickled), budget, refuse).load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - damaged bytes: pickle raises many kinds
        refuse(f'it is not a pickle of plain values ({type(exc).__name__})')
    check_matches(value, expected, refuse, budget)
    return value
