"""The Trainer: state, the train and validation loops, and hook dispatch (engine/dispatch.py).

Everything optional — stepping the optimizer, schedules, checkpoints, logging — is a hook. The
loop only fetches batches, runs the model step and calls the hooks of each stage (``docs/hooks.md``).
Checkpoints are the Checkpointer's (``trainer.checkpointer``, engine/checkpointer.py), the work
dir and its lock the WorkDir's (``trainer.workspace``, fileio/work_dir.py).
"""
import contextlib
import itertools
import time
from collections.abc import Mapping
from operator import attrgetter

import torch

from ..data.resumable import seed_everything, set_loader_epoch
from ..dist.process_group import broadcast_object, init_distributed, resolve_device, wrap_model
from ..errors import ConfigError
from ..fileio.work_dir import WorkDir
from ..hooks.base import STAGES
from ..logging.logger import close_logger, create_logger, start_log_file
from ..logging.meters import MeterBuffer
from ..registry import TRAINERS
from .arguments import check_arguments, check_model_swap, check_resume_arguments, check_run_length, \
    check_sharded_optimizer, check_train_step_model, positive_int, run_seed
from .builder import build_dataloader, build_model, build_optimizer
from .checkpointer import Checkpointer
from .compile import compile_model, compile_options
from .dispatch import HookDispatch, say_where
from .evaluator import build_evaluator, real_samples, take_first
from .model_step import as_outputs, call_model, check_losses, detach_outputs, has_train_step, mmcv_train_step, \
    move_to_device, sum_loss_terms, val_forward
from .outcome import Outcome
from .position import BETWEEN, ITERATION_DONE, Position
from .preflight import check_before_run
from .run_end import finish_run
from .run_length import plan_run_length
from .runner_names import MMCVRunnerAttributes
from .step import StepState


@TRAINERS.register_module(module_name=['default', 'Trainer', 'trainer', 'EpochBasedTrainer'])  # + ModelScope's
class Trainer(HookDispatch, MMCVRunnerAttributes):  # hook registration and dispatch; the MMCV runner names
    """Runs training with hooks.

    Args:
        model: an ``nn.Module`` or a config dict for the ``MODELS`` registry.
        optimizer: a ``torch.optim.Optimizer`` or a dict such as ``dict(type='AdamW', lr=1e-3)``
            (built over the model's trainable parameters).
        train_dataloader, val_dataloader: a ``DataLoader`` (torchdata's ``StatefulDataLoader``
            too), any iterable of batches, or a dict ``dict(dataset=..., batch_size=...,
            shuffle=..., num_workers=...)``. A DataLoader with a standard sampler is rebuilt
            around a resumable, seedable one; streams resume through their ``state_dict`` or
            by fast-forward (``docs/data.md``).
        val_evaluator: an object with ``reset/update/compute``, a ``torchmetrics.Metric``, a
            function ``(outputs, batch) -> dict`` or a dict such as ``dict(type='Accuracy')``.
        max_epochs, max_iters: exactly one of them. With ``max_iters`` the loader is cycled
            (a new pass, with ``set_epoch``, whenever one ends).
        iters_per_epoch: the iterations of an epoch, for a train loader without a length
            (required with ``max_epochs`` then); the data continues across epochs. ``None``:
            the loader's length, or for a stream in a ``max_iters`` run, all of it.
        work_dir: where logs and checkpoints go (created).
        seed: the run's seed; ``None`` draws one (logged, stored in checkpoints). It seeds the global
            RNGs, the data order and the workers; a model or loader built before the Trainer is not
            covered: call ``hookloop.seed_everything(seed)`` first (docs/data.md).
        device: ``'cpu'``, ``'cuda'``, ... ; ``None`` picks CUDA when available.
        loss_fn: ``loss_fn(outputs, batch)`` turning a plain model's outputs into a loss.
        lr_config, optimizer_config, checkpoint_config, log_config, momentum_config, timer_config,
            custom_hooks, evaluation: hook configs, as in MMCV (:meth:`register_training_hooks`).
        resume_from: a checkpoint path to continue from exactly, or ``'auto'``.
        auto_resume: continue from ``<work_dir>/last_checkpoint`` when it exists.
        load_from: a checkpoint whose model weights initialise a fresh run.
        revise_keys: ``[(regex, replacement), ...]`` applied to the keys of ``load_from`` weights.
        custom_imports: modules to import first (they register models, datasets, hooks).
        cfg: the config this trainer was built from, stored in checkpoint metadata.
        launcher: ``'auto'`` joins the torchrun job the environment describes, ``'pytorch'``
            requires one, ``'none'`` runs single-process (see ``docs/distributed.md``).
        dist_backend, dist_timeout: the process group's backend (``None``: nccl on CUDA, gloo
            on CPU) and how many seconds a collective waits for the other ranks.
        strategy: ``'ddp'`` (default with several ranks), ``'fsdp'`` (FSDP2) or ``'none'``.
        find_unused_parameters: passed to ``DistributedDataParallel``.
        resume_policy: ``None`` (a resume whose batches per epoch changed mid-epoch is refused) or
            ``'restart_epoch'`` (it continues from the next epoch).
        compile: ``True`` or a dict of ``torch.compile`` options; checkpoints keep the plain module's
            keys (``hookloop/engine/compile.py``).
        val_iters: run at most this many batches in each validation (ModelScope's
            ``val_iters_per_epoch``); ``None``: the whole val loader.
        device_prefetch: on CUDA, copy the next training batch to the GPU (pinned, non-blocking, on
            a side stream) while the current step runs (``hookloop/data/prefetch.py``); not on the CPU.

        Other names are refused (with a "did you mean"): a config written for MMCV 1.x (``runner``,
        ``data``, ``workflow``, ``fp16``, ...) or ModelScope goes through :func:`~hookloop.build_trainer`.
    """

    def __init__(self, model, optimizer=None, train_dataloader=None, val_dataloader=None, val_evaluator=None,
                 max_epochs=None, max_iters=None, work_dir='work_dirs/default', seed=None, device=None,
                 loss_fn=None, lr_config=None, optimizer_config=None, checkpoint_config=None, log_config=None,
                 momentum_config=None, timer_config=None, custom_hooks=None, evaluation=None,
                 resume_from=None, auto_resume=False, load_from=None, custom_imports=None, cfg=None,
                 log_level='INFO', launcher='auto', dist_backend=None, strategy=None, dist_timeout=1800,
                 find_unused_parameters=False, profile_hooks=False, revise_keys=None, iters_per_epoch=None,
                 resume_policy=None, compile=None, device_prefetch=True, val_iters=None, **mmcv_keys):
        check_arguments(type(self), mmcv_keys, custom_imports, evaluation)
        self.max_epochs, self.max_iters = positive_int('max_epochs', max_epochs), positive_int('max_iters', max_iters)
        self._given_iters_per_epoch = positive_int('iters_per_epoch', iters_per_epoch)
        self.val_iters = positive_int('val_iters', val_iters)
        if train_dataloader is not None:
            check_run_length(max_epochs, max_iters)
        self.by_epoch = max_epochs is not None
        check_resume_arguments(resume_from, load_from, resume_policy)
        self.resume_from, self.auto_resume, self.load_from = resume_from, auto_resume, load_from
        self.resume_policy, self.revise_keys, self.cfg, self.loss_fn = resume_policy, revise_keys, cfg, loss_fn

        self.rank, self.world_size = init_distributed(launcher, dist_backend, dist_timeout, device)
        # storage_dir: checkpoints (a path or a URL); work_dir: files written with open(), the same
        # directory or, for a URL, its local mirror (fileio/work_dir.py).
        self.workspace = WorkDir(work_dir, self.rank)
        self.storage_dir, self.work_dir = self.workspace.storage_dir, self.workspace.local_dir
        self.timestamp = broadcast_object(time.strftime('%Y%m%d_%H%M%S'))
        self.logger = create_logger(self.work_dir, self.timestamp, self.rank, log_level)
        self.seed, self._seed_given = run_seed(seed)  # None: drawn on rank 0, shared with every rank
        seed_everything(self.seed)

        # In a torchrun job a bare 'cuda' (or None with CUDA present) is cuda:LOCAL_RANK.
        self.device = resolve_device(device)
        self.model = build_model(model).to(self.device)
        self._model_train_step = has_train_step(self.model)  # MMCV: train_step(data_batch, optimizer) is the step
        if self._model_train_step:
            check_train_step_model(self.model, self.world_size, strategy)
        self._batches_stay = self.device.type == 'cpu'  # loaders yield CPU tensors: nothing to move
        self.device_prefetch = device_prefetch
        # The model the step calls: the model itself, or its DDP/FSDP wrapper. Hooks that
        # need parameters or weights use ``trainer.model``.
        self.wrapped_model = wrap_model(self.model, strategy, self.device, find_unused_parameters)
        compile_model(self.model, compile_options(compile))  # in place: wrappers and keys unchanged
        check_sharded_optimizer(self.wrapped_model, optimizer)
        self.optimizer = build_optimizer(optimizer, self.model)
        self.train_dataloader = build_dataloader(train_dataloader, 'train_dataloader', self.seed, self.rank,
                                                 self.world_size)
        self.val_dataloader = self.build_val_loader(val_dataloader)
        self.val_evaluator = build_evaluator(val_evaluator)
        plan_run_length(self, self._given_iters_per_epoch)

        self.position = Position()  # the counters; what a checkpoint's meta stores
        self.step = StepState(self.position)  # what hooks tell each other about the current step
        self.mode = 'train'
        self.outputs = self.val_outputs = self.data_batch = None
        self.metrics = {}  # the latest validation results (written by val() only)
        self.meters = MeterBuffer()
        self._losses = self.meters.bulk_series('loss')  # the step's scalar loss: one C call per iteration
        self.exception = self.stop_reason = None
        self._init_dispatch(profile_hooks)
        self._started = self._resume_again = False  # a train() began (load/resume spent); resume() since
        self._running = False
        self.resumed_from = None  # the checkpoint this run continued from (public, for hooks)
        # A resume with another optimizer config rebuilds its fresh groups from the config.
        self.checkpointer = Checkpointer(self, optimizer if isinstance(optimizer, Mapping) else None)
        self.register_training_hooks(lr_config, optimizer_config, checkpoint_config, log_config,
                                     momentum_config, timer_config, custom_hooks)
        if evaluation is not None:
            self._hook_list.register_evaluation(evaluation)

    # -- set-up ----------------------------------------------------------------------------
    def set_train_dataloader(self, loader, max_epochs=None, max_iters=None):
        """Give a trainer built without one its training data and run length (MMCV's
        ``runner.run(data_loaders, workflow)`` passes the loaders late)."""
        self.max_epochs, self.max_iters = check_run_length(max_epochs, max_iters)
        self.by_epoch = max_epochs is not None
        self.train_dataloader = build_dataloader(loader, 'train_dataloader', self.seed, self.rank, self.world_size)
        plan_run_length(self, self._given_iters_per_epoch)

    def set_model(self, model):
        """Train ``model`` instead, on the trainer's device (MMCV's ``runner.model = ...``): the one
        way to swap it, before the first run (see :func:`~hookloop.engine.arguments.check_model_swap`)."""
        check_model_swap(model, self._started, self.world_size)
        self.model = self.wrapped_model = model.to(self.device)
        self._model_train_step = has_train_step(model)

    def build_val_loader(self, loader):
        """A validation loader (resumable, sharded like the trainer's) from a DataLoader or a config."""
        return build_dataloader(loader, 'val_dataloader', self.seed, self.rank, self.world_size)

    def set_validation(self, loader, evaluator=None):
        """Validate on ``loader`` (a DataLoader or a config) from now on, and with ``evaluator`` (as
        ``val_evaluator`` accepts) when given: the one way to change them after construction
        (MMCV's ``EvalHook`` brings both)."""
        self.val_dataloader = self.build_val_loader(loader)
        if evaluator is not None:
            self.val_evaluator = build_evaluator(evaluator)

    # The counters live in ``self.position`` (see hookloop/engine/position.py); these read it
    # (attrgetter: a C-level getter, as cheap as a plain attribute for hooks reading it each step).
    epoch = property(attrgetter('position.epoch'), lambda self, v: setattr(self.position, 'epoch', v))
    iter = property(attrgetter('position.iter'), lambda self, v: setattr(self.position, 'iter', v))
    inner_iter = property(attrgetter('position.inner_iter'), lambda self, v: setattr(self.position, 'inner_iter', v))
    val_iter = property(attrgetter('position.val_iter'), lambda self, v: setattr(self.position, 'val_iter', v))

    @property
    def epoch_length(self):
        """Iterations in the current epoch: the loader's length, or fewer in the last epoch
        of an iteration-based run."""
        return min(self.iters_per_epoch, self.max_iters - self.epoch * self.iters_per_epoch)

    def request_stop(self, reason):
        """Stop after the current iteration (hooks use this, e.g. on SIGTERM)."""
        self.stop_reason = reason

    @property
    def outcome(self):
        """How this run ends (read-only, for hooks): :class:`~hookloop.engine.outcome.Outcome`."""
        return Outcome.of(self._started, self._running, self.stop_reason, self.exception)

    # -- training --------------------------------------------------------------------------
    def train(self):
        """Run training to ``max_epochs`` / ``max_iters`` (or until a hook requests a stop)."""
        if self.train_dataloader is None:
            raise ConfigError('train() needs a train_dataloader')
        if self.optimizer is None and not self._model_train_step:  # a train_step model may step nothing (MMCV)
            raise ConfigError('train() needs an optimizer')
        self.resolve_hooks()
        check_before_run(self)
        self.workspace.claim()
        try:  # a change the data cannot follow is refused before anything runs
            resume_path, resume_checkpoint, resume_point = self.checkpointer.plan_resume()
        except BaseException:
            self.workspace.release()
            raise
        if resume_checkpoint is not None and resume_point.iter >= self.max_iters:
            self.checkpointer.restore_finished(resume_path, resume_checkpoint, resume_point)
            return self.model
        start_log_file(self.logger)
        self.logger.info('hookloop run: seed %d, device %s, world size %d, work dir %s', self.seed, self.device,
                         self.world_size, self.storage_dir)
        self.logger.debug('hooks, in the order each stage runs them:\n%s', self.hook_order_table())
        self.exception = self.stop_reason = None
        self._running = True
        self._hook_list.frozen = 'while train() runs'
        run_start = (time.perf_counter(), self.iter)
        try:
            if self.load_from is not None and resume_path is None and not self._started:
                self.load_weights(self.load_from)
            self._setup_hooks()
            if resume_path is not None:  # the trainer's job: before before_run, so every hook starts from it
                self.checkpointer.restore(resume_path, resume_checkpoint)
                run_start = (run_start[0], self.iter)
            self._started, self._resume_again = True, False
            self.call_hook('before_run')
            self.checkpointer.take_baseline()  # what is non-finite by design, before anything trains
            while self.epoch < self.max_epochs and self.stop_reason is None:
                self._train_epoch()
        except BaseException as exc:
            self.exception = exc
            raise
        finally:
            self._running = self._in_epoch = False
            self._hook_list.frozen = None
            finish_run(self, run_start)
        return self.model

    def _train_epoch(self):
        stream = self.train_stream
        stream.begin_epoch(self.epoch, self.inner_iter)
        self.step.epoch_length = self.epoch_length
        self.mode = 'train'
        self.wrapped_model.train()
        self.call_hook('before_train_epoch')
        before, after = self._iteration_stages['before_train_iter'], self._iteration_stages['after_train_iter']
        before.plan(self)
        after.plan(self)
        self._in_epoch = True
        position, step, length = self.position, self.step, self.epoch_length
        next_batch, train_step, move, clock = stream.next_batch, self.train_step, not self._batches_stay, time.perf_counter
        step.begin()
        # The per-iteration path. Every line runs once per step, and on a small model each
        # Python function it enters costs about a microsecond (the step's kernels evict the
        # interpreter's caches), so it is kept flat: the stages' scheduling, the hook calls
        # (_call_each) and the position's moves (phase, iter, inner_iter) are written out here.
        while position.inner_iter < length and self.stop_reason is None:
            waited = clock()
            try:
                batch = next_batch()
            except Exception as exc:
                say_where(exc, f'loading batch {position.inner_iter} of epoch {position.epoch + 1} from train_dataloader')
                raise
            if move:
                batch = move_to_device(batch, self.device)
            self.data_batch = batch
            step.data_seconds += clock() - waited
            if position.iter >= before.next_due:
                before.walk(self)
            else:
                before.running = methods = iter(before.every)  # a re-plan in a hook finds its place there
                try:
                    for method in methods:
                        method(self)
                except Exception as exc:
                    self._note_hook_error(exc, method, 'before_train_iter')
                    raise
            self.outputs = train_step(batch)
            position.phase = ITERATION_DONE
            if position.iter >= after.next_due:
                after.walk(self)
            else:
                after.running = methods = iter(after.every)  # a re-plan in a hook finds its place there
                try:
                    for method in methods:
                        method(self)
                except Exception as exc:
                    self._note_hook_error(exc, method, 'after_train_iter')
                    raise
            if step.skip_reason is not None:  # a dropped update: free its graph before the next forward
                self.outputs = detach_outputs(self.outputs)
                step.begin()
            position.iter += 1
            position.inner_iter += 1
            position.phase = BETWEEN
        self._in_epoch = False
        stream.end_epoch()  # a per-epoch pass shuts its workers down before the epoch-end hooks
        if position.inner_iter < length:
            return  # stopped early: the epoch is not over
        position.end_epoch()
        self.call_hook('after_train_epoch')
        position.next_epoch()

    def to_device(self, batch):
        if self._batches_stay:
            return batch
        return move_to_device(batch, self.device)

    def train_step(self, batch):
        """The forward pass and the loss; backward and step belong to the optimizer hook."""
        context = self.step.forward_context
        try:
            if context is contextlib.nullcontext:  # no autocast, no no_sync: skip a context per step
                outputs = self._forward(batch)
            else:
                with context():
                    outputs = self._forward(batch)
        except Exception as exc:
            say_where(exc, f'the model step (forward and loss_fn) at iteration {self.iter}')
            raise
        if self._model_train_step:
            outputs, logged = outputs
            self.meters.update_dict(logged)
            return outputs
        if type(outputs) is torch.Tensor and not outputs.dim():  # the common case: a scalar loss
            self._losses.append(outputs.detach())
            return {'loss': outputs}
        outputs, terms = sum_loss_terms(as_outputs(outputs))
        check_losses(outputs, self.iter, backward=self.optimizer is not None)
        self._losses.collect()  # keep the order of 'loss' values
        self.meters.update_dict(terms)
        return outputs

    def _forward(self, batch):
        if self._model_train_step:
            return mmcv_train_step(self.model, batch, self.optimizer)
        kind = type(batch)  # call_model's rule for the usual list/tuple batch, without its frame per step
        outputs = self.wrapped_model(*batch) if kind is list or kind is tuple else call_model(self.wrapped_model, batch)
        if self.loss_fn is not None:
            outputs = self.loss_fn(outputs, batch)
        return outputs

    # -- validation ------------------------------------------------------------------------
    def val(self):
        """Run the validation loop once; returns (and stores in ``trainer.metrics``) the metrics. It counts
        ``trainer.val_iter`` and leaves the training counters alone: it may run in the middle of an epoch."""
        if self.val_dataloader is None:
            raise ConfigError('val() needs a val_dataloader')
        self.resolve_hooks()
        self._setup_hooks()
        was_training = self.wrapped_model.training
        self.mode = 'val'
        self.wrapped_model.eval()
        set_loader_epoch(self.val_dataloader, self.seed, 0, self.rank)
        if self.val_evaluator is not None:
            self.val_evaluator.reset()
        self.call_hook('before_val_epoch')
        before_iter, after_iter = self._dispatch['before_val_iter'], self._dispatch['after_val_iter']
        # Ranks past the end of the val set get wrapped-around copies of its first samples
        # (every rank runs the same number of forwards, FSDP needs that); the evaluator
        # sees only this rank's real samples, so the metric covers each sample once.
        remaining = real_samples(self.val_dataloader)
        self.val_iter = 0  # validation iterations completed, as iter counts training ones
        with torch.no_grad():
            batches = self.val_dataloader if self.val_iters is None else itertools.islice(self.val_dataloader,
                                                                                         self.val_iters)
            for batch in batches:
                self.data_batch = batch = self.to_device(batch)
                self._call_each(before_iter, 'before_val_iter')
                with self.step.val_forward_context():
                    self.val_outputs = val_forward(self.wrapped_model, self.model, batch, self.val_evaluator)
                if self.val_evaluator is not None:
                    outputs, kept = self.val_outputs, batch
                    if remaining is not None:
                        outputs, kept, remaining = take_first(self.val_outputs, batch, remaining)
                    if kept is not None:
                        self.val_evaluator.update(outputs, kept)
                self._call_each(after_iter, 'after_val_iter')
                self.val_iter += 1
        self.metrics = dict(self.val_evaluator.compute()) if self.val_evaluator is not None else {}
        self.position.validations += 1  # hooks tell a new result from an old one by this count
        self.call_hook('after_val_epoch')
        self.wrapped_model.train(was_training)
        self.mode = 'train'
        return self.metrics

    # -- checkpoints: the Checkpointer's (hookloop/engine/checkpointer.py) -----------------------
    def state_dict(self, save_optimizer=True, save_frozen=True):
        """Everything exact resume needs (:meth:`Checkpointer.state_dict`)."""
        return self.checkpointer.state_dict(save_optimizer, save_frozen)

    def build_checkpoint(self, save_optimizer=True, save_frozen=True):
        """:meth:`state_dict` plus what hooks add in ``before_save_checkpoint`` (:meth:`Checkpointer.build`)."""
        return self.checkpointer.build(save_optimizer, save_frozen)

    def write_checkpoint(self, checkpoint, path, update_last=True, asynchronous=False, on_disk=None):
        """Write ``checkpoint`` atomically to ``path``; returns the path (:meth:`Checkpointer.write`)."""
        return self.checkpointer.write(checkpoint, path, update_last, asynchronous, on_disk)

    def save_checkpoint(self, path, save_optimizer=True, update_last=True, asynchronous=False, on_disk=None):
        """Build and write a checkpoint; returns its path (:meth:`Checkpointer.save`)."""
        return self.checkpointer.save(path, save_optimizer, update_last, asynchronous, on_disk)

    def wait_for_checkpoint(self):
        """Wait until a background checkpoint write is on disk (:meth:`Checkpointer.wait`)."""
        self.checkpointer.wait()

    def resume(self, path):
        """Continue from the checkpoint at ``path`` (:meth:`Checkpointer.resume`)."""
        return self.checkpointer.resume(path)

    def load_weights(self, path, strict=True, revise_keys=None):
        """Initialise the model from a checkpoint's weights only (:meth:`Checkpointer.load_weights`)."""
        return self.checkpointer.load_weights(path, strict, revise_keys)

    def close(self):
        """Wait for a background checkpoint write, release the log files and the work dir's lock (no logging
        afterwards). The process group stays up for later trainers (re-creating it under torchrun is not
        reliable); it is destroyed at exit, or at once when training fails."""
        try:
            self.wait_for_checkpoint()
        finally:
            self.workspace.release()
        close_logger(self.logger)


__all__ = ['Trainer', 'STAGES']
