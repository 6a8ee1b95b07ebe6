"""The engine: the Trainer (loop, validation, dispatch), position and step state, the hook list
and iteration scheduling, the model step, the checkpointer and config builders.
May import: everything below it (hooks, logging, optim, data, dist, checkpoint, fileio).
"""
