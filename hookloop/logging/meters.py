"""Meters: the values the loggers read (losses, lr, grad_norm, time, memory, ...).

Values are appended as they come: tensors stay on their device, detached, and are
turned into numbers only by :meth:`MeterBuffer.summary`, called on log iterations.
A summary costs one host copy per device (and, when ``torch.distributed`` is
initialised, one all-reduce), however many keys and iterations it covers.

Several loggers with different intervals share one buffer: each remembers a
:meth:`MeterBuffer.mark` and asks for the summary of the values appended since,
so each averages over its own interval (MMCV's ``log_buffer.average(interval)``).

A producer of a value at every iteration need not pay a method call per value: it may collect
them itself and register a *source* (:meth:`MeterBuffer.add_source`), which the buffer calls
before every read to take them in (:meth:`MeterBuffer.extend`). :meth:`MeterBuffer.bulk_series`
is the ready-made one (its ``append`` is a C-level ``deque.append``); the trainer's loss and
``IterTimerHook`` work this way. A hook that wants to see every new summary
(``FiniteLossGuard``) registers a *listener* (:meth:`MeterBuffer.add_listener`) instead of
polling at every iteration.
"""
import math
import operator
import weakref
from collections import deque
from itertools import islice

import torch

from ..dist.process_group import get_world_size, is_distributed

DEFAULT_HISTORY = 1000


class MeterBuffer:
    """Per-key recent values and a running count of values ever appended per key.

    Args:
        history: how many recent values each key keeps (at least); loggers raise it to
            their interval with :meth:`reserve`.
    """

    def __init__(self, history=DEFAULT_HISTORY):
        self.history = history
        self._values = {}   # key -> deque of recent values (tensors or numbers)
        self._totals = {}   # key -> number of values ever appended (drives marks)
        self._version = 0   # bumped on every change; invalidates the summary cache
        self._cache = None  # (version, since, summary) of the last summary
        # The most recent summary (host numbers): hooks may read it without a sync.
        self.last_summary = None
        self._listeners = []
        self._sources = []
        self._bulk = []

    def add_listener(self, listener):
        """Call ``listener(summary)`` after each new summary is computed (not on cache hits)."""
        self._listeners.append(listener)

    def remove_listener(self, listener):
        if listener in self._listeners:
            self._listeners.remove(listener)

    def add_source(self, source):
        """Call ``source()`` before every read (:meth:`summary`, :meth:`mark`, :meth:`keys`,
        ``in``), so it can hand over the values it collected since the last read."""
        self._sources.append(source)

    def remove_source(self, source):
        if source in self._sources:
            self._sources.remove(source)

    def _collect(self):
        for source in self._sources:
            source()

    def reserve(self, n):
        """Keep at least the last ``n`` values of every key (a logger's interval)."""
        if n > self.history:
            self._collect()
            self.history = n
            self._values = {k: deque(v, maxlen=n) for k, v in self._values.items()}
            for series in self._bulk:
                series.resize(n)

    def bulk_series(self, key):
        """A :class:`BulkSeries` of ``key``: ``series.append(value)`` costs a C call; the values
        join the buffer on its next read."""
        series = BulkSeries(self, key)
        self._bulk.append(series)
        self.add_source(series.collect)
        return series

    def update(self, key, value):
        """Add one value: a scalar tensor (kept on its device, detached) or a number."""
        if isinstance(value, torch.Tensor):
            value = value.detach()
        values = self._values.get(key)
        if values is None:
            values = self._values[key] = deque(maxlen=self.history)
            self._totals[key] = 0
        values.append(value)
        self._totals[key] += 1
        self._version += 1

    def update_dict(self, values):
        for key, value in values.items():
            self.update(key, value)

    def extend(self, key, values, count=None):
        """Add the values a source collected (detached tensors or numbers): the most recent
        ``values`` (a sized iterable) of ``count`` (default ``len(values)``) produced since its
        last hand-over."""
        count = len(values) if count is None else count
        if not count:
            return
        series = self._values.get(key)
        if series is None:
            series = self._values[key] = deque(maxlen=self.history)
            self._totals[key] = 0
        series.extend(values)
        self._totals[key] += count
        self._version += 1

    def revise(self, key, values):
        """Replace the newest ``len(values)`` values of ``key`` (a source re-measuring what it
        handed over earlier in the same iteration; ``IterTimerHook``); counts and marks stay."""
        series = self._values[key]
        for _ in range(min(len(values), len(series))):
            series.pop()
        series.extend(values)
        self._version += 1

    def __contains__(self, key):
        self._collect()
        return key in self._values

    def keys(self):
        self._collect()
        return list(self._values)

    def clear(self):
        """Forget all values (marks taken before still work: they see nothing new)."""
        self._collect()
        for values in self._values.values():
            values.clear()
        self._version += 1
        self._cache = None

    def mark(self):
        """A position: pass it to :meth:`summary` to average only what comes after it."""
        self._collect()
        return dict(self._totals)

    def summary(self, since=None):
        """``{key: {'avg': mean, 'latest': last value, 'count': n}}`` over the values
        appended after the mark ``since`` (all kept values when ``None``).

        Each device's tensors are copied to the host together (one copy per device, however
        many keys; CPU tensors are read where they are) and averaged there. Under
        ``torch.distributed`` every value is then averaged across ranks with one
        all-reduce, so every rank must call this at the same iterations with the same keys.
        Repeated calls with no update in between reuse the result (no second sync).
        """
        self._collect()
        return self._summary(since or {})

    def summary_and_mark(self, since=None, across_ranks=True):
        """``(summary(since), mark())`` with one collection of the sources (a logger's read).
        ``across_ranks=False``: this rank's own values, no collective (a look that not every rank
        makes, such as one before a save rank 0 makes alone); not a log event: listeners are not told."""
        self._collect()
        if not across_ranks:
            return self._to_host(self._windows(since or {})), dict(self._totals)
        return self._summary(since or {}), dict(self._totals)

    def _summary(self, since):
        cached = self._cache
        if cached is not None and cached[0] == self._version and cached[1] == since:
            return cached[2]
        result = self._to_host(self._windows(since))
        if is_distributed() and get_world_size() > 1:
            result = _average_across_ranks(result)
        self._cache = (self._version, dict(since), result)
        self.last_summary = result
        for listener in list(self._listeners):
            listener(result)
        return result

    def _windows(self, since):
        """``{key: [values appended after the mark since]}``."""
        windows = {}
        totals = self._totals
        for key, values in self._values.items():
            new = totals[key] - since.get(key, 0)
            if new <= 0 or not values:
                continue
            if new >= len(values):
                windows[key] = list(values)
            else:  # the newest ``new``, read from the end (the deque may hold far more)
                windows[key] = list(islice(reversed(values), new))[::-1]
        return windows

    @staticmethod
    def _to_host(windows):
        # (the order of the keys is what a record lists: the host numbers' first, then each device's)
        result, pending = {}, {}
        for key, values in windows.items():
            first = values[0]
            if isinstance(first, torch.Tensor):
                numbers = _cpu_numbers(values) if first.is_cpu else None
                if numbers is not None:
                    pending.setdefault(_CPU, []).append((key, numbers))
                    continue
                stacked = _stack_scalars(values)
                if stacked is not None:
                    pending.setdefault(stacked.device, []).append((key, stacked))
                    continue
            result[key] = _stats(list(map(float, values)))  # numbers (a stray tensor among them costs its own sync)
        for items in pending.values():
            stacks = [values for _, values in items if type(values) is not list]
            if len(stacks) > 1:
                copied = torch.cat(stacks).tolist()  # the one host copy
            elif stacks:
                copied = stacks[0].tolist()
            start = 0
            for key, values in items:
                if type(values) is list:  # read on the host already
                    result[key] = _stats(values)
                else:
                    result[key] = _stats(copied[start:start + len(values)])
                    start += len(values)
        return result

    def averages(self, since=None):
        return {key: value['avg'] for key, value in self.summary(since).items()}


def _stats(numbers):
    return {'avg': math.fsum(numbers) / len(numbers), 'latest': numbers[-1], 'count': len(numbers)}


_CPU = torch.device('cpu')
_dtype = operator.attrgetter('dtype')
_item = torch.Tensor.item
# Tensors whose ``item()`` is the number the float32 summary of a device's tensors gives.
_EXACT_IN_FLOAT32 = frozenset((torch.float32, torch.float16, torch.bfloat16))


def _cpu_numbers(values):
    """The numbers of the one-element CPU tensors ``values`` as :func:`_stack_scalars` and a
    host copy give them, read one by one (no stack: on the host that is the dearer way), or
    None when they are not all float32/float16/bfloat16 CPU tensors of one element."""
    try:
        if not set(map(_dtype, values)) <= _EXACT_IN_FLOAT32:
            return None  # float64, integers...: converted to float32 first, as on a device
        numbers = list(map(_item, values))
    except (TypeError, AttributeError, RuntimeError):  # not tensors, or more than one element
        return None
    return numbers


def _stack_scalars(values):
    """One float tensor of the one-element tensors ``values`` (on one device), or None when
    they are not all that."""
    try:
        stacked = torch.stack(values)  # the usual case: same shapes
        if stacked.dtype is not torch.float32:  # (each tensor method is a dispatcher call: only when needed)
            stacked = stacked.float()
        return stacked if stacked.dim() == 1 else stacked.reshape(len(values))
    except (TypeError, RuntimeError):
        if all(isinstance(v, torch.Tensor) for v in values):
            return torch.stack([v.float().reshape(()) for v in values])  # [] and [1] mixed
        return None


class BulkSeries:
    """Values of one meter key, appended where they are produced (``append``, a bound
    ``deque.append``) and handed to the buffer when it is read. The deque keeps the last
    ``history`` values: more between two reads could not be averaged by any reader anyway
    (a logger reserves its interval), so the dropped ones are not counted either."""

    def __init__(self, meters, key):
        self._meters, self.key = weakref.ref(meters), key  # (the meters hold this: no cycle)
        self.resize(meters.history)

    def resize(self, history):
        kept = getattr(self, '_values', ())
        self._values = deque(kept, maxlen=history)
        self.append = self._values.append

    def collect(self):
        if self._values:
            self._meters().extend(self.key, self._values)
            self._values.clear()


def _average_across_ranks(result):
    """Mean of every ``avg`` and ``latest`` over the ranks: one all-reduce of one tensor.

    The keys are sorted so every rank packs them in the same order. A checksum of the key
    names travels along, so ranks that log different keys of the same count fail loudly
    instead of mixing metrics (different counts make the collective itself fail).
    """
    import zlib

    import torch.distributed as dist
    keys = sorted(result)
    device = torch.device('cuda', torch.cuda.current_device()) \
        if dist.get_backend() == 'nccl' else torch.device('cpu')
    checksum = float(zlib.crc32('\0'.join(keys).encode()))
    packed = torch.tensor([checksum] + [result[k][f] for k in keys for f in ('avg', 'latest')],
                          dtype=torch.float64, device=device)
    dist.all_reduce(packed)
    numbers = packed.tolist()
    world = get_world_size()
    if numbers[0] != checksum * world:
        raise RuntimeError(f'meters differ across ranks (this rank has {keys}); every rank must log '
                           'the same keys at the same iterations')
    return {k: {'avg': numbers[1 + 2 * n] / world, 'latest': numbers[2 + 2 * n] / world,
                'count': result[k]['count']} for n, k in enumerate(keys)}
