"""Meters: where losses, timings and metrics wait for the loggers.

Values are appended as they come: tensors stay on their device, detached, and are
turned into numbers only by :meth:`MeterBuffer.summary`, called once per log
interval. That is the single host sync of a log event, however many keys and
iterations it covers.
"""
import torch


class MeterBuffer:
    """Per-key values since the last :meth:`clear`, plus the latest value of each key."""

    def __init__(self):
        self._values = {}

    def update(self, key, value):
        """Add one value (a scalar tensor, kept on its device, or a number)."""
        if isinstance(value, torch.Tensor):
            value = value.detach()
        values = self._values.get(key)
        if values is None:
            self._values[key] = [value]
        else:
            values.append(value)

    def update_dict(self, values):
        for key, value in values.items():
            self.update(key, value)

    def __contains__(self, key):
        return key in self._values

    def keys(self):
        return list(self._values)

    def clear(self):
        self._values = {}

    def summary(self):
        """``{key: {'avg': mean over the interval, 'latest': last value, 'count': n}}``.

        All tensors of all keys are reduced on their devices and copied to the host
        together: one ``tolist`` per device.
        """
        result, pending = {}, {}
        for key, values in self._values.items():
            if not values:
                continue
            tensors = [v for v in values if isinstance(v, torch.Tensor)]
            if tensors:
                stacked = torch.stack([t.float().reshape(()) for t in tensors])
                pending.setdefault(stacked.device, []).append((key, stacked.mean(), stacked[-1]))
            else:
                result[key] = {'avg': sum(values) / len(values), 'latest': values[-1], 'count': len(values)}
        for items in pending.values():
            numbers = torch.stack([t for _, avg, last in items for t in (avg, last)]).tolist()
            for n, (key, _, _) in enumerate(items):
                result[key] = {'avg': numbers[2 * n], 'latest': numbers[2 * n + 1],
                               'count': len(self._values[key])}
        return result

    def averages(self):
        return {key: value['avg'] for key, value in self.summary().items()}
