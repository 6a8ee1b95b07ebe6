"""SavePipelineHook: writes the fine-tuned model as a loadable pipeline directory."""
import os

from ..priority import Priority
from ..registry import HOOKS
from ..hooks.base import Hook


@HOOKS.register_module()
class SavePipelineHook(Hook):
    """At the end of a completed run, rank 0 calls ``trainer.model.save_pretrained(dir)``.

    For the diffusers back-end that is a ``StableDiffusionPipeline`` directory
    (``DiffusionPipeline.from_pretrained(dir)`` loads it; safetensors weights); for the tiny
    back-end ``TinyDiffusion.from_pretrained(dir)`` loads it.

    Args:
        out_dir: the directory, relative to the work dir unless absolute.

    A run that failed or stopped early saves nothing: its checkpoint is what resumes it. The
    directory goes through the weights gate (``trainer.checkpointer.export_directory``): weights
    with a NaN/inf are refused (``InvalidLossError``), the directory appears whole or not at all,
    and each file has its checksum sidecar (``<file>.xxh128`` / ``.sha256``).
    """

    PRIORITY = Priority.LOW

    def __init__(self, out_dir='pipeline'):
        self.out_dir = out_dir

    def output_dirs(self, trainer):
        return {'pipeline': os.path.join(trainer.work_dir, os.fspath(self.out_dir))}

    def after_run(self, trainer):
        if trainer.outcome.failed or trainer.iter < trainer.max_iters or trainer.rank != 0:
            return
        path = os.path.join(trainer.work_dir, os.fspath(self.out_dir))
        # through the gate (checkpoint/gate.py): refused if the weights are not finite; written
        # whole into a temporary sibling, each file with its checksum sidecar, then swapped in
        trainer.checkpointer.export_directory(path, trainer.model.save_pretrained, trainer.model.state_dict())
        trainer.logger.info('saved the fine-tuned pipeline to %s', path)
