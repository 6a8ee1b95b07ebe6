"""The trainer of a run built from a ModelScope configuration (``build_trainer('trainer',
dict(cfg_file=...))``, ``hookloop train configuration.json``): hookloop's Trainer with the
names of ModelScope's ``EpochBasedTrainer`` that ModelScope code calls and reads.

State: ``cfg`` (the configuration, as ``cfg_modify_fn`` left it, attribute access),
``train_dataset`` / ``eval_dataset``, ``data_loader`` (the current mode's loader, assignable),
``log_buffer`` (ModelScope's, :mod:`.modelscope_log_buffer`), ``train_outputs``,
``metric_values`` (the last evaluation's metrics; ``None`` before one), ``_hooks`` (the registered
hooks; assigning a list unregisters the others: hookloop's default hooks still fill an empty role
when the run starts), ``_epoch`` / ``_iter`` / ``_inner_iter`` / ``_max_epochs`` / ``_max_iters``.

Methods: ``train(checkpoint_path=None, load_all_state=True)``, ``evaluate(checkpoint_path=None)``,
``register_hook_from_cfg([cfg, ...])`` (a hook of a class already registered is not registered
twice), ``register_optimizers_hook()`` / ``register_processors()`` (hookloop registers the
optimizer and LR hooks from the configuration when the trainer is built: these resolve the hooks,
adding the defaults of empty roles, so ``_hooks`` lists what will run), and the loop ModelScope's
tests drive by hand::

    loader = trainer._build_dataloader_with_dataset(trainer.train_dataset, **trainer.cfg.train.dataloader)
    trainer.invoke_hook('before_run')
    for _ in range(trainer._epoch, trainer._max_epochs):
        trainer.invoke_hook('before_train_epoch')
        for batch in loader:
            trainer.invoke_hook('before_train_iter')
            trainer.train_step(trainer.model, batch)
            trainer.invoke_hook('after_train_iter')
        trainer.invoke_hook('after_train_epoch')
        trainer._epoch += 1          # optional, as in ModelScope's loop
    trainer.invoke_hook('after_run')

``invoke_hook`` runs a stage's hooks as ``train()`` does (the work dir claimed and the log file
started at ``before_run``; the run summary and the lock released at ``after_run``), and keeps
the position as ModelScope's loop does: ``iter`` is the current iteration until the next one
starts (or the caller counts it with ``_iter += 1``), ``epoch`` the current epoch until the next
one starts (or ``_epoch += 1``). ``data_load_time`` is the time between an iteration's end and
the next one's start (ModelScope's ``IterTimerHook``). Any other name calls that method of every
hook that has it.
"""
import os
import time
import weakref
from collections.abc import Mapping

from ..checkpoint.resume_search import checkpoints_in
from ..engine.builder import build_dataloader
from ..engine.model_step import detach_outputs
from ..engine.position import BETWEEN, EPOCH_DONE, ITERATION_DONE
from ..engine.preflight import check_before_run
from ..engine.run_end import finish_run
from ..engine.trainer import Trainer
from ..errors import ConfigError
from ..logging.logger import start_log_file
from ..registry import HOOKS, TRAINERS
from .modelscope import is_stream
from .modelscope_collate import modelscope_collate
from .modelscope_config import ModelScopeConfig
from .modelscope_log_buffer import ModelScopeLogBuffer
from .modelscope_lr_hooks import ModelScopeLrSchedulerHook  # noqa: F401  (registers the LR hooks its runs use)

_LOOP_STAGES = ('before_run', 'before_train_epoch', 'before_train_iter', 'after_train_iter', 'after_train_epoch',
                'after_run')
_LOADER_OPTIONS = ('drop_last', 'pin_memory', 'persistent_workers', 'collate_fn')


def note_existing_checkpoints(trainer):
    """A new run in a work dir that holds checkpoints says so (they would be overwritten); the
    note is logged before the run starts and written first into its ``.log``."""
    found = checkpoints_in([trainer.storage_dir] + trainer.checkpointer.checkpoint_dirs())
    if found:
        trainer.logger.warning('%s holds %d checkpoint(s) (e.g. %s): this run starts from iteration 0; pass '
                               "resume_from='auto' (or train(checkpoint_path=...)) to continue the run they "
                               'belong to', trainer.storage_dir, len(found), os.path.basename(sorted(found)[-1]))


@TRAINERS.register_module()
class ModelScopeTrainer(Trainer):
    """ModelScope's ``EpochBasedTrainer`` names on the Trainer (see the module docstring).
    Arguments: the Trainer's; ``cfg`` is the ModelScope configuration."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.cfg, Mapping) and not isinstance(self.cfg, ModelScopeConfig):
            self.cfg = ModelScopeConfig(self.cfg)  # attribute access, as ModelScope's Config
        self._modelscope_log_buffer = ModelScopeLogBuffer(weakref.proxy(self))
        self._by_hand = None  # (perf_counter, iter) at invoke_hook('before_run'): a run driven by hand goes on
        self._iteration_end = None  # when the last iteration driven by hand ended (data_load_time)

    # -- ModelScope's state ----------------------------------------------------------------
    @property
    def log_buffer(self):
        return self._modelscope_log_buffer

    @property
    def train_dataset(self):
        return getattr(self.train_dataloader, 'dataset', None)

    @property
    def eval_dataset(self):
        return getattr(self.val_dataloader, 'dataset', None)

    @property
    def data_loader(self):
        return self.train_dataloader if self.mode == 'train' else self.val_dataloader

    @data_loader.setter
    def data_loader(self, loader):
        if self.mode == 'train':
            self.train_dataloader = loader
        else:
            self.val_dataloader = loader

    @property
    def metric_values(self):
        return self.metrics if self.position.validations else None

    @property
    def _hooks(self):
        return list(self.hooks)

    @_hooks.setter
    def _hooks(self, hooks):
        hooks = list(hooks)
        for hook in self.hooks:
            if not any(hook is kept for kept in hooks):
                self.remove_hook(hook)
        for hook in hooks:
            if not any(hook is registered for registered in self.hooks):
                self.register_hook(hook)

    _max_epochs = property(lambda self: self.max_epochs)
    _max_iters = property(lambda self: self.max_iters)

    @property
    def _epoch(self):
        return self.position.epoch

    @_epoch.setter
    def _epoch(self, value):
        if self.position.phase == EPOCH_DONE and value == self.position.epoch + 1:
            self.position.next_epoch()  # ModelScope's loop counting the epoch that just ended
        else:
            self.position.epoch = value

    @property
    def _iter(self):
        return self.position.iter

    @_iter.setter
    def _iter(self, value):
        if self.position.phase == ITERATION_DONE and value == self.position.iter + 1:
            self._count_iteration()  # ModelScope's loop counting the iteration that just ended
        else:
            self.position.iter = value

    @property
    def _inner_iter(self):
        return self.position.inner_iter

    @_inner_iter.setter
    def _inner_iter(self, value):
        self.position.inner_iter = value

    # -- hooks -----------------------------------------------------------------------------
    def register_hook_from_cfg(self, hook_cfg):
        """Register hooks from config dicts (a list, as ModelScope, or one dict); returns them. A
        config whose hook class is registered already gives that hook (ModelScope registers each
        hook type once)."""
        hooks = []
        for cfg in [hook_cfg] if isinstance(hook_cfg, dict) else list(hook_cfg):
            kind = cfg.get('type') if isinstance(cfg, dict) else None
            kind = HOOKS.get(kind) if isinstance(kind, str) and kind in HOOKS else kind
            present = next((hook for hook in self.hooks if isinstance(kind, type) and type(hook) is kind), None)
            hooks.append(present if present is not None else self.register_hook(dict(cfg)))
        return hooks

    def register_optimizers_hook(self):
        """ModelScope registers its optimizer and LR hooks here; hookloop did when the trainer was
        built: the hooks are resolved (defaults added), so ``_hooks`` lists what will run."""
        self.resolve_hooks()

    register_processors = register_optimizers_hook  # ModelScope's hook processors: nothing more to set up

    def call_hook(self, stage, *args):
        if stage == 'before_train_epoch':  # ModelScope's logger hook clears the buffer as an epoch starts
            self._modelscope_log_buffer.clear()
        super().call_hook(stage, *args)

    def invoke_hook(self, fn_name, *args):
        """ModelScope's ``invoke_hook(stage)`` (see the module docstring)."""
        if fn_name in _LOOP_STAGES and not args:
            return getattr(self, f'_hand_{fn_name}')()
        self.resolve_hooks()
        if fn_name in self._dispatch:
            return self.call_hook(fn_name, *args)
        for hook in self.hooks:
            method = getattr(hook, fn_name, None)
            if callable(method):
                method(self, *args)

    # -- the loop driven by hand ---------------------------------------------------------------
    def _hand_before_run(self):
        if self._running:
            raise ConfigError("invoke_hook('before_run') while a run goes on")
        self.resolve_hooks()
        check_before_run(self)
        self.workspace.claim()
        start_log_file(self.logger)
        self.logger.info('hookloop run driven by invoke_hook: seed %d, device %s, world size %d, work dir %s',
                         self.seed, self.device, self.world_size, self.storage_dir)
        self.exception = self.stop_reason = None
        self._running, self._by_hand = True, (time.perf_counter(), self.iter)
        self._hook_list.frozen = 'while a run driven by invoke_hook goes on'
        try:
            self._setup_hooks()
            self._started = True
            self.call_hook('before_run')
            self.checkpointer.take_baseline()
        except BaseException as exc:
            self.exception = exc
            self._hand_after_run()
            raise

    def _hand_before_train_epoch(self):
        self._running_by_hand('before_train_epoch')
        self._count_iteration()
        if self.position.phase == EPOCH_DONE:  # the caller did not count the epoch that ended
            self.position.next_epoch()
        self.mode = 'train'
        self.wrapped_model.train()
        self.step.epoch_length = self.epoch_length
        self.step.begin()
        self.call_hook('before_train_epoch')
        self._iteration_end = time.perf_counter()

    def _hand_before_train_iter(self):
        self._running_by_hand('before_train_iter')
        self._count_iteration()
        if self._iteration_end is not None:  # the caller's batch fetch: ModelScope's data_load_time
            self.step.data_seconds += time.perf_counter() - self._iteration_end
        self._call_each(self._dispatch['before_train_iter'], 'before_train_iter')

    def _hand_after_train_iter(self):
        self._running_by_hand('after_train_iter')
        self.position.phase = ITERATION_DONE
        self._call_each(self._dispatch['after_train_iter'], 'after_train_iter')
        if self.step.skip_reason is not None:  # a dropped update: free its graph
            self.outputs = detach_outputs(self.outputs)
            self.step.begin()
        self._iteration_end = time.perf_counter()

    def _hand_after_train_epoch(self):
        self._running_by_hand('after_train_epoch')
        self._count_iteration()
        self.position.end_epoch()
        self.call_hook('after_train_epoch')

    def _hand_after_run(self):
        self._running_by_hand('after_run')
        self._count_iteration()
        if self.position.phase == EPOCH_DONE:
            self.position.next_epoch()
        run_start, self._by_hand = self._by_hand, None
        self._running, self._iteration_end = False, None
        self._hook_list.frozen = None
        finish_run(self, run_start)

    def _running_by_hand(self, stage):
        if self._by_hand is None:
            raise ConfigError(f"invoke_hook({stage!r}) needs invoke_hook('before_run') first")

    def _count_iteration(self):
        """Count the iteration whose ``after_train_iter`` ran, as the training loop does."""
        position = self.position
        if position.phase == ITERATION_DONE:
            position.iter += 1
            position.inner_iter += 1
            position.phase = BETWEEN

    # -- steps, data, runs ---------------------------------------------------------------------
    def train_step(self, model, inputs=None):
        """ModelScope's ``train_step(model, inputs)``: the forward and the loss of one batch
        (``train_outputs``); backward and step belong to the optimizer hook. (With one
        argument: the training loop's step of a batch.)"""
        if inputs is None:
            return super().train_step(model)
        if model is not self.model and model is not self.wrapped_model:
            raise ConfigError("train_step(model, inputs): model must be the trainer's model (trainer.model)")
        self.mode = 'train'
        self.wrapped_model.train()
        self.data_batch = batch = self.to_device(inputs)
        self.outputs = super().train_step(batch)

    def _build_dataloader_with_dataset(self, dataset, batch_size_per_gpu=1, workers_per_gpu=0, dist=False,
                                       shuffle=True, seed=0, **kwargs):
        """ModelScope's loader of ``dataset``: hookloop's (seeded by the run's seed, sharded by
        rank under torchrun whatever ``dist`` says), batched as the trainer's loader is
        (ModelScope's default collator unless ``data_collator`` was given); a stream is not
        shuffled. ``seed`` is ModelScope's and not used."""
        unknown = sorted(set(kwargs) - set(_LOADER_OPTIONS))
        if unknown:
            raise ConfigError(f'_build_dataloader_with_dataset got unknown options {unknown}')
        kwargs.setdefault('collate_fn', getattr(self.train_dataloader, 'collate_fn', modelscope_collate))
        config = dict(dataset=dataset, batch_size=batch_size_per_gpu, num_workers=workers_per_gpu,
                      shuffle=bool(shuffle) and not is_stream(dataset), **kwargs)
        return build_dataloader(config, 'train_dataloader', self.seed, self.rank, self.world_size)

    def train(self, checkpoint_path=None, load_all_state=True):
        """ModelScope's ``train(checkpoint_path=None, load_all_state=True)``: a checkpoint path
        continues that run exactly (``load_all_state=False``: its weights only). A new run in a
        work dir that holds checkpoints says so first."""
        if checkpoint_path is not None:
            if load_all_state:
                self.resume(checkpoint_path)
            else:
                self.load_weights(checkpoint_path)
        elif self.resume_from is None and not self._started:
            note_existing_checkpoints(self)
        return super().train()

    def evaluate(self, checkpoint_path=None):
        """ModelScope's ``evaluate(checkpoint_path=None)``: the metrics of the eval set (with the
        weights of ``checkpoint_path`` when given)."""
        if self.val_dataloader is None:
            raise ConfigError('evaluate() needs an eval_dataset')
        if checkpoint_path is not None:
            self.load_weights(checkpoint_path)
        return self.val()


__all__ = ['ModelScopeTrainer', 'note_existing_checkpoints']
