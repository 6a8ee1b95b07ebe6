"""ModelScope's Stable Diffusion trainers on hookloop: ``'dreambooth-diffusion'`` and
``'lora-diffusion'`` (the values of ModelScope's ``Trainers.dreambooth_diffusion`` /
``Trainers.lora_diffusion``), with ModelScope's meaning for every argument.

``build_trainer(name='dreambooth-diffusion', default_args=dict(model=MODEL_DIR, train_dataset=rows,
eval_dataset=rows, cfg_modify_fn=fn, work_dir=..., with_prior_preservation=..., ...))`` reads
``MODEL_DIR/configuration.json`` (after ``cfg_modify_fn`` and ``cfg_options``) as ModelScope does:
its ``model`` section builds ModelScope's ``stable-diffusion`` model
(:mod:`hookloop.dreambooth.modelscope_model`), its ``preprocessor`` section prepares the rows of
the datasets (an image and a caption each: :class:`~hookloop.dreambooth.ImageCaptionRows`),
and ``train`` / ``evaluation`` give the optimizer, the schedule, the loaders, the run length
and the hooks (:func:`hookloop.compat.modelscope.trainer_args`). An epoch is one pass over
``train_dataset``; each step trains on the rows' own captions; with prior preservation one
class image (generated before the run from ``class_prompt``) adds
``prior_loss_weight * its loss``, as ModelScope's trainer does. What the run writes is
ModelScope's: ``epoch_N.pth`` checkpoints (hookloop's crash-safe files, exact resume),
``output/`` with ``configuration.json`` and the pipeline (DreamBooth) or the LoRA weights, and
the log every ``train.logging.interval`` iterations (10 by default). ``evaluate()`` computes the
configuration's metrics over ``eval_dataset`` (``loss-metric`` by default).

The model, the row dataset and the class samples come from ``hookloop.dreambooth`` by their
registered names (``MODELS`` / ``DATASETS``), as ModelScope builds its model from the
configuration's ``model.type``. docs/dreambooth.md compares the arguments with diffusers' and
lists where hookloop differs from ModelScope on purpose.
"""
import copy
import json
import os
from collections.abc import Mapping

import torch

from ..checkpoint.resume_search import checkpoints_in
from ..data.resumable import mix_seed, seed_everything
from ..errors import ConfigError
from ..fileio import storage
from ..registry import DATASETS, HOOKS, MODELS, TRAINERS
from ..engine.trainer import Trainer
from .modelscope import MODELSCOPE_SEED, trainer_args
from .modelscope_config import load_configuration
from .modelscope_hooks import CONFIGURATION, EVAL_RESULT_FILE, ModelScopeCheckpointHook

CONFIGURATION_PIPELINE = 'diffusers-stable-diffusion'  # what ModelScope's pipeline() builds for output/
_EVALUATION_STREAM = 1_000_003  # mixed with the seed: evaluation's noise, apart from training's
_PREPROCESSOR = 'diffusion-image-generation-preprocessor'
_PREPROCESSOR_KEYS = ('resolution', 'mean', 'std', 'image_keys', 'center_crop')
_NEEDED = ('as_dtype', 'save_modelscope_pipeline', 'save_modelscope_lora', 'fill_class_images',
           'class_image_rows')  # what the trainers ask of the model (ModelScopeStableDiffusion has them)


def model_directory(model, cfg_file, trainer):
    """``(model_dir, built_model_or_None)``: ``model`` as ModelScope takes it, a local model
    directory (its ``configuration.json`` is the configuration unless ``cfg_file`` is given) or an
    already built model (``cfg_file`` then names the configuration)."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise ConfigError(f'{trainer} model {path!r} is not a local directory: hookloop does not download from '
                              'the ModelScope hub; download the model first (e.g. `modelscope download --model '
                              f'{path} --local_dir DIR`) and pass model=DIR')
        if cfg_file is None and not os.path.isfile(os.path.join(path, CONFIGURATION)):
            raise ConfigError(f'{trainer} model directory {path!r} has no {CONFIGURATION} (give cfg_file=...)')
        return path, None
    if isinstance(model, torch.nn.Module):
        if cfg_file is None:
            raise ConfigError(f'{trainer}: a built model needs cfg_file= (its configuration.json), as in ModelScope')
        return os.path.dirname(os.fspath(cfg_file)), model
    raise ConfigError(f'{trainer} needs model= (a local model directory or a built model), got {model!r}')


def preprocessor_options(cfg, trainer):
    """The rows' preparation from the configuration's ``preprocessor`` section (removed from it)."""
    section = cfg.pop('preprocessor', None) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f'{trainer}: preprocessor must be a dict, got {section!r}')
    section = dict(section)
    kind = section.pop('type', _PREPROCESSOR)
    if kind != _PREPROCESSOR:
        raise ConfigError(f'{trainer}: preprocessor type {kind!r} is not supported (only {_PREPROCESSOR!r}, '
                          'the Stable Diffusion models\' one)')
    section.pop('model_dir', None)
    unknown = sorted(set(section) - set(_PREPROCESSOR_KEYS))
    if unknown:
        raise ConfigError(f'{trainer}: preprocessor got unknown keys {unknown}; known: {list(_PREPROCESSOR_KEYS)}')
    return section


@HOOKS.register_module()
class ModelScopeDiffusionCheckpointHook(ModelScopeCheckpointHook):
    """``ModelScopeCheckpointHook`` whose ``output/`` holds what ModelScope's Stable Diffusion
    trainers write there (their checkpoint processors): ``write_weights(directory)`` writes the weights
    (the fine-tuned pipeline, or the LoRA file), beside ``configuration.json`` and the latest
    ``eval_result.txt``. The folder goes through the weights gate whole
    (``trainer.checkpointer.export_directory``: finite, written aside and swapped in).

    Args (beyond :class:`~hookloop.compat.modelscope_hooks.ModelScopeCheckpointHook`'s):
        write_weights: ``write_weights(directory)`` writes the weight files.
        trained_state: ``trained_state()`` returns the trained tensors, checked before writing.
    """

    copies_model_files = False  # ModelScope's Stable Diffusion models write their output/ themselves

    def __init__(self, write_weights=None, trained_state=None, **kwargs):
        super().__init__(**kwargs)
        if not callable(write_weights) or not callable(trained_state):
            raise ConfigError('ModelScopeDiffusionCheckpointHook needs write_weights and trained_state callables')
        self.write_weights, self.trained_state = write_weights, trained_state

    def _export(self, trainer, folder):
        if trainer.rank != 0:
            return
        text = json.dumps(self.configuration if self.configuration is not None else {}, indent=4, default=repr)
        metrics = json.dumps({k: float(v) if isinstance(v, torch.Tensor) and v.numel() == 1 else v
                              for k, v in trainer.metrics.items()}, default=repr) if trainer.metrics else None

        def write(directory):
            self.write_weights(directory)
            with open(os.path.join(directory, CONFIGURATION), 'w', encoding='utf-8') as f:
                f.write(text)
            if metrics is not None:
                with open(os.path.join(directory, EVAL_RESULT_FILE), 'w', encoding='utf-8') as f:
                    f.write(metrics)
        trainer.checkpointer.export_directory(storage.join(trainer.storage_dir, folder), write, self.trained_state())


class ModelScopeDiffusionTrainer(Trainer):
    """What ModelScope's two Stable Diffusion trainers share (see the module docstring).

    Args (ModelScope's ``EpochBasedTrainer`` and its Stable Diffusion trainers):
        model: a local model directory (``configuration.json`` and the diffusers parts), or a built
            ``stable-diffusion`` model with ``cfg_file``.
        cfg_file, cfg_modify_fn, cfg_options: the configuration, a function that changes it and
            returns it, dotted overrides (applied in that order).
        train_dataset, eval_dataset: rows with an image and a caption (a ``MsDataset``, a
            Hugging Face dataset, a map-style dataset or a list of dicts; see
            :class:`~hookloop.dreambooth.ImageCaptionRows`).
        seed: 42 unless given, as ModelScope.
        torch_type: the dtype of the weights written to ``output/``: ``torch.float16``,
            ``'float16'``, ... (default: as trained, float32).
        safe_serialization: write ``output/`` as safetensors (default False: ``.bin`` files,
            which ModelScope's ``pipeline()`` reads by default).
        model_revision: for a hub model id; a local directory has no revision (ignored, as in ModelScope).
        prompt: the examples' pipeline prompt; trainers do not read it (ignored, as in ModelScope).
        data_collator, optimizers, callbacks, work_dir, max_epochs, device, launcher, use_fp16,
            train_iters_per_epoch, val_iters_per_epoch, and hookloop's ``resume_from`` (a path or
            ``'auto'``): as for ModelScope's ``EpochBasedTrainer`` (docs/migration.md).
    """

    takes_modelscope_arguments = True  # build_trainer passes the arguments as they are
    NAME = None

    def __init__(self, model=None, cfg_file=None, cfg_modify_fn=None, cfg_options=None, train_dataset=None,
                 eval_dataset=None, seed=MODELSCOPE_SEED, torch_type=None, safe_serialization=False, model_revision=None,
                 prompt=None, preprocessor=None, arg_parse_fn=None, **kwargs):
        name = self.NAME
        for given, what in ((preprocessor, 'preprocessor'), (arg_parse_fn, 'arg_parse_fn')):
            if given is not None:
                raise ConfigError(f'{name} {what}= is not supported: the configuration\'s preprocessor section '
                                  'prepares the rows (resolution, center_crop, mean, std, image_keys)')
        if not isinstance(safe_serialization, bool):
            raise ConfigError(f'{name} safe_serialization must be True or False, got {safe_serialization!r}')
        self.safe_serialization = safe_serialization
        model_dir, built = model_directory(model, cfg_file, name)
        cfg = load_configuration(cfg_file or os.path.join(model_dir, CONFIGURATION), cfg_modify_fn, cfg_options)
        prepare = preprocessor_options(cfg, name)
        self._rows = dict(resolution=prepare.get('resolution', 512), center_crop=prepare.get('center_crop', True),
                          mean=prepare.get('mean', (0.5,)), std=prepare.get('std', (0.5,)),
                          image_keys=prepare.get('image_keys', ()))
        args = dict(kwargs, seed=seed)
        for rows, what in ((train_dataset, 'train_dataset'), (eval_dataset, 'eval_dataset')):
            if rows is not None:  # checked before the model is loaded
                args[what] = DATASETS.build(dict(type='ImageCaptionData', rows=rows, **self._rows))
                args[what].check_columns(f'{name} {what}')
        if isinstance(seed, int) and not isinstance(seed, bool):
            seed_everything(seed)  # before the model (LoRA's initialisation draws), as ModelScope seeds first
        section = dict(cfg.pop('model', None) or {})
        if built is None:
            built = MODELS.build(dict(section, type=section.get('type', 'stable-diffusion'), model_dir=model_dir,
                                      **self.model_options(section)))
        else:
            self.check_built_model(built)
        missing = [method for method in _NEEDED if not hasattr(built, method)]
        if missing:
            raise ConfigError(f'{name}: the model {type(built).__name__} lacks {missing}: use ModelScope\'s '
                              f"stable-diffusion model (a model directory whose configuration.json says "
                              f"model.type='stable-diffusion')")
        self.torch_type = built.as_dtype(torch_type)
        self.model_dir = model_dir
        args['model'] = built
        cfg['model'] = section
        configuration = copy.deepcopy(cfg.to_dict())  # what output/configuration.json records
        configuration['pipeline'] = {'type': CONFIGURATION_PIPELINE}
        if prepare:
            configuration['preprocessor'] = dict(prepare, type=_PREPROCESSOR)
        cfg.pop('dataset', None)  # the datasets are the rows given to the trainer
        translated = trainer_args(args, cfg=cfg)
        self._eval = self.split_evaluation(translated)
        checkpoint = dict(translated.get('checkpoint_config') or {})
        checkpoint.update(type='ModelScopeDiffusionCheckpointHook', configuration=configuration,
                          write_weights=self.export_weights, trained_state=self.trained_state)
        checkpoint.setdefault('save_frozen', False)  # the frozen parts are the model directory's
        translated['checkpoint_config'] = checkpoint
        self._ignored = {k: v for k, v in (('model_revision', model_revision), ('prompt', prompt)) if v is not None}
        self.prepare_loss(translated)
        super().__init__(**translated)
        for key, value in self._ignored.items():
            self.logger.info('%s: %s=%r is not used (as in ModelScope: %s)', name, key, value,
                             'a local model directory has no revision' if key == 'model_revision'
                             else 'the prompt is for the pipeline after training')

    # -- what the two trainers set differently --------------------------------------------------
    def model_options(self, section):
        """Arguments the trainer adds to the configuration's ``model`` section."""
        return {}

    def check_built_model(self, model):
        """A model given built (not a directory) must be what this trainer would have built."""

    def prepare_loss(self, translated):
        """Set ``translated['loss_fn']`` when the step needs more than the model's loss."""

    def export_weights(self, directory):
        raise NotImplementedError

    def trained_state(self):
        """The trained tensors (what the weights gate checks before ``output/`` is written)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    # -- evaluation ----------------------------------------------------------------------------
    def split_evaluation(self, translated):
        """ModelScope evaluates during training only with an EvaluationHook; the eval set and the
        metrics are kept for :meth:`evaluate` otherwise (hookloop's default would evaluate every epoch)."""
        kept = {key: translated.get(key) for key in ('val_dataloader', 'val_evaluator')}
        if translated.get('evaluation') is None:
            translated.pop('val_dataloader', None)
            translated.pop('val_evaluator', None)
        return kept

    def evaluate(self, checkpoint_path=None):
        """ModelScope's ``evaluate()``: the configuration's metrics over ``eval_dataset`` (after
        loading the weights of ``checkpoint_path``, a hookloop checkpoint, when given)."""
        if checkpoint_path is not None:
            self.load_weights(checkpoint_path)
        if self.val_dataloader is not None:
            return self.val()
        if self._eval['val_dataloader'] is None:
            raise ConfigError(f'{self.NAME}.evaluate() needs an eval_dataset')
        loader, evaluator = self.val_dataloader, self.val_evaluator
        self.val_dataloader = self.build_val_loader(self._eval['val_dataloader'])
        self._eval['val_dataloader'] = self.val_dataloader  # built once
        self.val_evaluator = self._eval['val_evaluator']
        try:
            return self.val()
        finally:
            self.val_dataloader, self.val_evaluator = loader, evaluator

    def val(self):
        """Validation draws its noise from the global RNG, as ModelScope's does, but forked and
        seeded from the run's seed: every evaluation draws the same noise (so results compare)
        and the training run's randomness is left alone (a resume stays exact)."""
        devices = [self.device] if self.device.type == 'cuda' else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(mix_seed(self.seed, _EVALUATION_STREAM))
            return super().val()

    # -- the run -------------------------------------------------------------------------------
    def train(self, checkpoint_path=None, *args, **kwargs):
        """ModelScope's ``train(checkpoint_path=None)``: ``checkpoint_path`` continues from a
        hookloop checkpoint (as ``resume_from``)."""
        if args or kwargs:
            raise ConfigError(f'{self.NAME}.train() takes checkpoint_path only, got {args or ""} {kwargs or ""}')
        if checkpoint_path is not None:
            self.resume(checkpoint_path)
        elif self.resume_from is None and not self._started:
            self.note_existing_checkpoints()
        return super().train()

    def note_existing_checkpoints(self):
        """A new run in a work dir that holds checkpoints says so (they would be overwritten)."""
        found = checkpoints_in([self.storage_dir] + self.checkpointer.checkpoint_dirs())
        if found:
            self.logger.warning('%s holds %d checkpoint(s) (e.g. %s): this run starts from iteration 0; pass '
                                "resume_from='auto' (or train(checkpoint_path=...)) to continue the run they "
                                'belong to', self.storage_dir, len(found), os.path.basename(sorted(found)[-1]))


@TRAINERS.register_module(module_name=['dreambooth-diffusion', 'ModelScopeDreamBoothTrainer'])
class ModelScopeDreamBoothTrainer(ModelScopeDiffusionTrainer):
    """ModelScope's ``DreamboothDiffusionTrainer``: the whole UNet fine-tuned on the rows' images
    and captions; with ``with_prior_preservation``, one class image per step adds
    ``prior_loss_weight`` times its loss.

    Args (beyond :class:`ModelScopeDiffusionTrainer`'s):
        with_prior_preservation: add the class-prior term (default False, as ModelScope).
        instance_prompt: ModelScope generates the class images from it (a bug); here they come
            from ``class_prompt`` and the rows' captions are the training prompts: not used.
        class_prompt: the prompt of the class images (default ``'a photo of dog'``).
        class_data_dir: where the class images are (default ``<work_dir>/class_data``; ModelScope:
            ``/tmp/class_data``); missing ones are generated before the run.
        num_class_images: how many (default 200).
        resolution: the size class images are generated at and cropped to (default 512).
        prior_loss_weight: the prior term's weight (default 1.0).
    """

    NAME = 'dreambooth-diffusion'

    def __init__(self, *args, with_prior_preservation=False, instance_prompt='a photo of sks dog',
                 class_prompt='a photo of dog', class_data_dir=None, num_class_images=200, resolution=512,
                 prior_loss_weight=1.0, sample_batch_size=1, **kwargs):
        if 'lora_rank' in kwargs:
            raise ConfigError("dreambooth-diffusion fine-tunes the whole UNet: lora_rank is an argument of "
                              "'lora-diffusion' (build_trainer(name='lora-diffusion', ...))")
        if not isinstance(with_prior_preservation, bool):
            raise ConfigError(f'dreambooth-diffusion with_prior_preservation must be True or False, '
                              f'got {with_prior_preservation!r}')
        for value, what in ((num_class_images, 'num_class_images'), (resolution, 'resolution'),
                            (sample_batch_size, 'sample_batch_size')):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f'dreambooth-diffusion {what} must be a positive int, got {value!r}')
        if isinstance(prior_loss_weight, bool) or not isinstance(prior_loss_weight, (int, float)) or \
                not prior_loss_weight >= 0:
            raise ConfigError(f'dreambooth-diffusion prior_loss_weight must be a number >= 0, got {prior_loss_weight!r}')
        if with_prior_preservation and (not isinstance(class_prompt, str) or not class_prompt.strip()):
            raise ConfigError('dreambooth-diffusion with_prior_preservation=True needs a class_prompt')
        self.with_prior_preservation, self.prior_loss_weight = with_prior_preservation, prior_loss_weight
        self.instance_prompt, self.class_prompt, self.num_class_images = instance_prompt, class_prompt, num_class_images
        self.resolution, self.sample_batch_size = resolution, sample_batch_size
        work_dir = os.fspath(kwargs.get('work_dir') or 'work_dirs/default')
        self.class_data_dir = os.fspath(class_data_dir) if class_data_dir is not None else \
            os.path.join(os.path.abspath(work_dir), 'class_data')
        self.class_rows = None  # the class images, listed after they are generated
        super().__init__(*args, **kwargs)
        if not with_prior_preservation:
            self.logger.warning('dreambooth-diffusion: with_prior_preservation is False, so class_prompt, '
                                'class_data_dir and num_class_images are not used (as in ModelScope)')
        self.logger.info('dreambooth-diffusion: instance_prompt %r is not used: the captions of train_dataset are '
                         'the prompts (ModelScope generates the class images from it, a bug; hookloop uses '
                         'class_prompt %r)', instance_prompt, class_prompt)

    def model_options(self, section):
        if section.get('lora_tune'):
            raise ConfigError("dreambooth-diffusion fine-tunes the whole UNet, but the configuration's model says "
                              "lora_tune=true: use build_trainer(name='lora-diffusion', ...) for LoRA")
        return {}

    def prepare_loss(self, translated):
        if self.with_prior_preservation:
            translated['loss_fn'] = self.add_prior_loss

    def add_prior_loss(self, outputs, batch):
        """ModelScope's prior term: the loss of one class image (sample ``order[iter % n]`` of a
        fixed permutation, so a resumed run takes the same ones) times ``prior_loss_weight``."""
        index = int(self.class_order[self.iter % len(self.class_order)])
        item = self.class_rows[index]
        target = item['target'].unsqueeze(0).to(self.device)
        prior = self.model(text=[item['text']], target=target)['loss']
        loss = outputs['loss']
        return {'loss': loss + self.prior_loss_weight * prior, 'loss_instance': loss.detach(),
                'loss_prior': prior.detach()}

    def train(self, checkpoint_path=None, *args, **kwargs):
        """Generate the missing class images (prior preservation), then train."""
        if self.with_prior_preservation and self.class_rows is None:
            self.generate_class_images()
        return super().train(checkpoint_path, *args, **kwargs)

    def generate_class_images(self):
        """Fill ``class_data_dir`` up to ``num_class_images`` images of ``class_prompt`` at
        ``resolution`` (hookloop's generator per sample: the training randomness is unchanged)."""
        self.model.fill_class_images(self.class_data_dir, self.class_prompt, self.num_class_images, self.seed,
                                     self.sample_batch_size, self.resolution, self.rank, self.world_size,
                                     self.logger)
        rows = self.model.class_image_rows(self.class_data_dir, self.class_prompt, self.num_class_images)
        # ModelScope's class loader crops at random (torchvision's RandomCrop), at the class resolution
        self.class_rows = DATASETS.build(dict(type='ImageCaptionRows', rows=rows, **dict(
            self._rows, resolution=self.resolution, center_crop=False)))
        generator = torch.Generator().manual_seed(mix_seed(self.seed, len(rows)))
        self.class_order = torch.randperm(len(rows), generator=generator)

    def export_weights(self, directory):
        self.model.save_modelscope_pipeline(directory, self.safe_serialization, self.torch_type)


@TRAINERS.register_module(module_name=['lora-diffusion', 'ModelScopeLoraDiffusionTrainer'])
class ModelScopeLoraDiffusionTrainer(ModelScopeDiffusionTrainer):
    """ModelScope's ``LoraDiffusionTrainer``: LoRA adapters of rank ``lora_rank`` (alpha = rank,
    as diffusers' ``LoRAAttnProcessor`` without ``network_alpha``) on every attention projection
    of the UNet (``to_q``, ``to_k``, ``to_v``, ``to_out.0``); only they train. ``output/`` holds
    ``pytorch_lora_weights.bin`` (``.safetensors`` with ``safe_serialization``) in diffusers'
    format: ``pipe.load_lora_weights(output_dir, weight_name=...)`` loads it.

    Args (beyond :class:`ModelScopeDiffusionTrainer`'s):
        lora_rank: the adapters' rank (default 4).
    """

    NAME = 'lora-diffusion'

    def __init__(self, *args, lora_rank=4, **kwargs):
        if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1:
            raise ConfigError(f'lora-diffusion lora_rank must be a positive int, got {lora_rank!r}')
        self.lora_rank = lora_rank
        super().__init__(*args, **kwargs)

    def model_options(self, section):
        return {'lora_rank': self.lora_rank}

    def check_built_model(self, model):
        lora = getattr(model, 'lora', None)
        if not lora or lora.get('rank') != self.lora_rank:
            raise ConfigError(f'lora-diffusion adds LoRA adapters of rank {self.lora_rank} when it builds the model '
                              'from its directory: pass model=DIR, or a stable-diffusion model built with '
                              f'lora_rank={self.lora_rank}')

    def export_weights(self, directory):
        self.model.save_modelscope_lora(directory, self.safe_serialization, self.torch_type)


__all__ = ['ModelScopeDreamBoothTrainer', 'ModelScopeLoraDiffusionTrainer', 'ModelScopeDiffusionCheckpointHook']
