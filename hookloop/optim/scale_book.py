"""fp16's loss-scale and skipped-step meters, copied from the device only where the scale changes."""
import torch

from .amp import scale_tensor


class ScaleBook:
    """fp16's ``skipped_steps`` and ``loss_scale`` meters without a device copy per step.

    Whether a step ran is known on the host at no cost: the GradScaler calls the optimizer's
    ``step`` only when the gradients are finite, and a step post-hook counts those calls
    (``steps_ran``). The scale then changes only at known steps: a skipped one (back-off) and,
    dynamic, every ``growth_interval``-th finite step in a row (growth), GradScaler's own rule
    followed on the host from its growth tracker. Only there is the scale copied (``scale_tensor``);
    every step appends to the meters (C-level ``deque.append``) the copy in force and a cached
    tensor of the run of skipped steps, so the meters hold, step by step, the very values the
    per-step copies held. An optimizer that skips steps itself (``_step_supports_amp_scaling``,
    the fused ones) or has no step hooks keeps the per-step way (:meth:`attach` gives None).

    The step hook is on the user's optimizer only while hookloop steps it: from :meth:`attach`
    or :meth:`open` (a run starts) to :meth:`close` (the run ends, however); a step made while
    it is off (``is_open`` False) takes the per-step way.
    """

    def __init__(self, scaler, optimizer, static):
        self.scaler, self.static = scaler, static
        self.steps_ran = 0
        self._optimizer, self._handle = optimizer, None
        self._dynamic = not static and scaler.is_enabled()
        self._interval = scaler.get_growth_interval() if self._dynamic else 0
        self._tracker = 0      # the scaler's growth tracker, followed on the host (see loaded)
        self._run = 0          # steps skipped in a row up to the last one
        self._scale = None     # the copy of the scale in force (None: copy at the next step)
        self._runs = {}        # run length -> its tensor (float32, on the scale's device)
        self._meters = self._append_run = self._append_scale = None
        self.open()

    @classmethod
    def attach(cls, scaler, optimizer, static):
        if not scaler.is_enabled() or getattr(optimizer, '_step_supports_amp_scaling', False) or \
                not callable(getattr(optimizer, 'register_step_post_hook', None)):
            return None
        return cls(scaler, optimizer, static)

    def _ran(self, optimizer, args, kwargs):
        self.steps_ran += 1

    @property
    def is_open(self):
        return self._handle is not None

    def open(self):
        """Count the optimizer's steps (again, for a later run), from the scaler's state as it is
        now: something may have changed it between the runs."""
        if self._handle is None:
            self._handle = self._optimizer.register_step_post_hook(self._ran)
            self.loaded(self.scaler.state_dict())

    def close(self):
        """Take the step hook off the optimizer (the user's object outlives the run)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def loaded(self, scaler_state):
        """The scaler's state was replaced (a checkpoint): follow its tracker, copy its scale."""
        self._tracker = int(scaler_state.get('_growth_tracker', 0)) if self._dynamic else 0
        self._scale = None

    def record(self, meters, skipped):
        """After ``scaler.update()``: this step's ``skipped_steps`` and ``loss_scale``."""
        changed = self._scale is None
        if skipped:
            self._run += 1
            if self._dynamic:
                self._tracker, changed = 0, True  # backed off
        else:
            self._run = 0
            if self._dynamic:
                self._tracker += 1
                if self._tracker == self._interval:  # grown (or kept, if growing overflowed)
                    self._tracker, changed = 0, True
        if changed:
            self._scale = scale_tensor(self.scaler)
        run = self._runs.get(self._run)
        if run is None:
            run = self._runs[self._run] = torch.full((), float(self._run), dtype=torch.float32,
                                                     device=self._scale.device)
        if self._meters is not meters:  # the first step: the keys join the meters where they always did
            meters.update('skipped_steps', run)
            meters.update('loss_scale', self._scale)
            self._meters = meters
            self._append_run = meters.bulk_series('skipped_steps').append
            self._append_scale = meters.bulk_series('loss_scale').append
        else:
            self._append_run(run)
            self._append_scale(self._scale)


def skipped_run(scaler, optimizer, run):
    """The per-step way (an optimizer that skips inf/NaN steps itself, or has no step hooks): the
    steps the scaler skipped in a row up to this one, after ``scaler.step`` and before ``update()``,
    as a device tensor (no host sync), from ``run``, the previous step's (None at first). None when
    the scaler says nothing about this optimizer."""
    found = getattr(scaler, '_found_inf_per_device', None)  # filled by unscale_, reset by update()
    try:
        infs = found(optimizer) if found is not None else {}
    except (KeyError, RuntimeError):
        infs = {}
    if len(infs) == 1:  # one device: a fresh 0./1. tensor of this step
        skipped = next(iter(infs.values()))
    elif infs:
        device = next(iter(infs.values())).device
        skipped = (torch.stack([inf.reshape(()).to(device) for inf in infs.values()]).sum() > 0).float()
    else:
        return None
    # one kernel: skipped * (run + 1), i.e. the run goes on or restarts at 0
    return skipped if run is None else torch.addcmul(skipped, run, skipped)


__all__ = ['ScaleBook', 'skipped_run']
