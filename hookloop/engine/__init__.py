"""The engine: the Trainer (loop, validation) with its Checkpointer, hook dispatch, argument
checks and the MMCV runner names; position and step state, the hook list and iteration
scheduling, the model step, resume requests, preflight checks, the end of a run and its summary.
May import: everything below it (hooks, logging, optim, data, dist, checkpoint, fileio, config, ...).
"""
