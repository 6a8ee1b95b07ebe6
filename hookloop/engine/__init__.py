"""The engine: the Trainer (loop, validation, dispatch), position and step state, the hook list
and iteration scheduling, the model step, resume requests, preflight checks, the run summary.
May import: everything below it (hooks, logging, optim, data, dist, checkpoint, fileio, config, ...).
"""
