"""Gradient accumulation windows: which iterations of an epoch share one optimizer step."""


def accumulation_window(inner_iter, epoch_length, cumulative_iters):
    """``(start, size)`` of the window holding the 0-based ``inner_iter`` of an epoch of
    ``epoch_length`` iterations: windows of ``cumulative_iters`` from iteration 0, the last
    one cut short by the end of the epoch."""
    start = inner_iter - inner_iter % cumulative_iters
    return start, min(cumulative_iters, epoch_length - start)
