"""The metrics of MMCV's validation workflow: the ``log_vars`` of ``model.val_step``.

In MMCV a workflow ``('val', k)`` runs ``val_step(data_batch, None)`` over the val loader and
logs the ``log_vars`` it returns, averaged with ``num_samples`` as weights.
"""
import torch

from ..dist.process_group import all_gather_objects


class LogVarsEvaluator:
    """Sample-weighted means of ``outputs['log_vars']`` (the loss terms when absent)."""

    def reset(self):
        self.sums, self.count = {}, 0

    def __init__(self):
        self.reset()

    def update(self, outputs, batch):
        log_vars = outputs.get('log_vars') or {k: v for k, v in outputs.items() if 'loss' in k}
        n = int(outputs.get('num_samples', 1))
        for key, value in log_vars.items():
            value = value.detach().float().mean().item() if isinstance(value, torch.Tensor) else float(value)
            self.sums[key] = self.sums.get(key, 0.0) + value * n
        self.count += n

    def compute(self):
        sums, count = {}, 0
        for rank_sums, rank_count in all_gather_objects((self.sums, self.count)):
            for key, value in rank_sums.items():
                sums[key] = sums.get(key, 0.0) + value
            count += rank_count
        return {key: value / max(count, 1) for key, value in sums.items()}
