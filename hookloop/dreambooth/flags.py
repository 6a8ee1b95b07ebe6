"""The flags of diffusers' ``examples/dreambooth/train_dreambooth_lora.py`` in
``dreambooth_diffusion``: each one either works with its diffusers meaning or is refused
with one line naming hookloop's spelling (or why it is not supported), so a ported
command line never builds and silently does something else.

``FLAGS`` maps a flag name to ``(kind, text)``:

* ``'same'``: a ``dreambooth_diffusion`` argument of that name, same meaning;
* ``'works'``: accepted under the diffusers name and turned into ``text`` (see
  :func:`take_diffusers_flags`);
* ``'spelt'``: refused; ``text`` is the hookloop spelling;
* ``'unsupported'``: refused; ``text`` says why.

docs/dreambooth.md's flag table is this table.
"""
from collections.abc import Mapping

from ..errors import ConfigError

FLAGS = {
    'pretrained_model_name_or_path': ('works', 'model=PATH (a local pipeline directory)'),
    'revision': ('spelt', "model=dict(type='DiffusersDreamBooth', pretrained_model_name_or_path=..., revision=...)"),
    'variant': ('spelt', "model=dict(type='DiffusersDreamBooth', pretrained_model_name_or_path=..., variant=...)"),
    'tokenizer_name': ('unsupported', "the tokenizer is the pipeline's tokenizer/ folder"),
    'instance_data_dir': ('same', 'instance_data_dir'),
    'class_data_dir': ('same', 'class_data_dir (default <work_dir>/class_samples)'),
    'instance_prompt': ('same', 'instance_prompt'),
    'class_prompt': ('same', 'class_prompt'),
    'validation_prompt': ('spelt', 'validation=dict(prompts=[...])'),
    'num_validation_images': ('spelt', 'validation=dict(num_images=N)'),
    'validation_epochs': ('spelt', 'validation=dict(every_n_iters=N) (counted in iterations)'),
    'with_prior_preservation': ('same', 'with_prior_preservation'),
    'prior_loss_weight': ('same', 'prior_loss_weight'),
    'num_class_images': ('same', 'num_class_images'),
    'output_dir': ('works', "work_dir=DIR (the LoRA file goes to <work_dir>/<pipeline_dir>, default 'pipeline')"),
    'seed': ('same', 'seed (the same RNG use as the script: docs/dreambooth.md)'),
    'resolution': ('same', "resolution (default: the model's native size; diffusers: 512)"),
    'center_crop': ('same', 'center_crop'),
    'train_text_encoder': ('same', 'train_text_encoder (with lora: LoRA adapters on the text encoder)'),
    'train_batch_size': ('works', 'train_dataloader=dict(batch_size=N) (default 1; diffusers: 4)'),
    'sample_batch_size': ('same', 'sample_batch_size'),
    'num_train_epochs': ('spelt', 'max_epochs=N'),
    'max_train_steps': ('works', 'max_iters=N'),
    'checkpointing_steps': ('works', 'checkpoint_config=dict(interval=N, by_epoch=False) (default every 500)'),
    'checkpoints_total_limit': ('works', 'checkpoint_config=dict(max_keep_ckpts=N)'),
    'resume_from_checkpoint': ('spelt', "resume_from=PATH, or 'hookloop train CONFIG --resume auto' for latest"),
    'gradient_accumulation_steps': ('spelt', 'optimizer_config=dict(cumulative_iters=N)'),
    'gradient_checkpointing': ('same', 'gradient_checkpointing'),
    'learning_rate': ('works', "optimizer=dict(type='AdamW', lr=...) (diffusers' default 5e-4)"),
    'scale_lr': ('same', 'scale_lr'),
    'lr_scheduler': ('spelt', "lr_config=dict(policy=...) ('constant': no lr_config)"),
    'lr_warmup_steps': ('spelt', "lr_config=dict(policy='Fixed', warmup='linear', warmup_iters=N, warmup_ratio=0.0) "
                                 "(diffusers' 'constant' schedule ignores it)"),
    'lr_num_cycles': ('spelt', "lr_config=dict(policy='CosineRestart', periods=[...], restart_weights=[...])"),
    'lr_power': ('spelt', "lr_config=dict(policy='Poly', power=...)"),
    'dataloader_num_workers': ('works', 'train_dataloader=dict(num_workers=N)'),
    'use_8bit_adam': ('same', 'use_8bit_adam'),
    'adam_beta1': ('works', "optimizer=dict(type='AdamW', betas=(beta1, beta2))"),
    'adam_beta2': ('works', "optimizer=dict(type='AdamW', betas=(beta1, beta2))"),
    'adam_weight_decay': ('works', "optimizer=dict(type='AdamW', weight_decay=...) (AdamW's default is 1e-2 too)"),
    'adam_epsilon': ('works', "optimizer=dict(type='AdamW', eps=...)"),
    'max_grad_norm': ('same', 'max_grad_norm'),
    'push_to_hub': ('unsupported', 'hookloop does not upload; upload <work_dir>/pipeline with huggingface-cli'),
    'hub_token': ('unsupported', 'hookloop does not upload; upload <work_dir>/pipeline with huggingface-cli'),
    'hub_model_id': ('unsupported', 'hookloop does not upload; upload <work_dir>/pipeline with huggingface-cli'),
    'logging_dir': ('spelt', 'work_dir (logs and TensorBoard events go under it)'),
    'allow_tf32': ('unsupported', 'set torch.backends.cuda.matmul.allow_tf32 in a module listed in custom_imports'),
    'report_to': ('spelt', "log_config=dict(hooks=[dict(type='TensorboardLoggerHook'), dict(type='WandbLoggerHook')])"),
    'mixed_precision': ('works', "optimizer_config=dict(precision='fp16'|'bf16') ('no': none)"),
    'prior_generation_precision': ('unsupported', "class images are generated in the model's own dtype"),
    'local_rank': ('unsupported', 'torchrun sets LOCAL_RANK, which hookloop reads'),
    'enable_xformers_memory_efficient_attention': ('unsupported', "diffusers' default attention (PyTorch SDPA) is used"),
    'pre_compute_text_embeddings': ('same', 'pre_compute_text_embeddings'),
    'tokenizer_max_length': ('same', 'tokenizer_max_length'),
    'text_encoder_use_attention_mask': ('unsupported', 'prompts are encoded without an attention mask (the '
                                                       "script's default)"),
    'validation_images': ('unsupported', 'for image-conditioned pipelines (variation, super-resolution) only'),
    'class_labels_conditioning': ('unsupported', 'for DeepFloyd IF UNets only'),
    'rank': ('spelt', 'lora=dict(rank=N) (alpha defaults to the rank, as diffusers)'),
    'lora_dropout': ('spelt', 'lora=dict(dropout=P)'),
    'image_interpolation_mode': ('same', 'image_interpolation_mode (lanczos by default with lora)'),
}

# The arguments of ModelScope's 'dreambooth-diffusion' / 'lora-diffusion' trainers (and of its
# EpochBasedTrainer) that dreambooth_diffusion does not take: each one is refused with what to
# write instead, never dropped (ModelScope's trainers themselves: build_trainer(name='dreambooth-diffusion')).
_MODELSCOPE = "; for ModelScope's meaning use build_trainer(name='dreambooth-diffusion', ...)"
MODELSCOPE_ARGUMENTS = {
    'train_dataset': 'instance_data_dir=DIR or instance_data=<images> with one instance_prompt for them all '
                     "(ModelScope's rows with their own captions: name='dreambooth-diffusion')",
    'eval_dataset': 'validation=dict(prompts=[...]) for validation images' + _MODELSCOPE,
    'cfg_file': 'the trainer arguments themselves (optimizer=, max_iters=, lr_config=, ...)' + _MODELSCOPE,
    'cfg_modify_fn': 'the trainer arguments themselves (optimizer=, max_iters=, lr_config=, ...)' + _MODELSCOPE,
    'cfg_options': 'the trainer arguments themselves, or hookloop train CONFIG --cfg-options a.b=VALUE',
    'torch_type': "optimizer_config=dict(precision='fp16'|'bf16') (the frozen weights are cast to it)",
    'safe_serialization': 'nothing: the pipeline is written with safetensors' + _MODELSCOPE,
    'model_revision': "model=dict(type='DiffusersDreamBooth', pretrained_model_name_or_path=DIR, revision=...)",
    'lora_rank': 'lora=dict(rank=N) (alpha defaults to the rank)',
    'prompt': "validation=dict(prompts=[...]) (ModelScope's examples use it after training only)",
    'data_collator': 'nothing: the trainer collates its own batches' + _MODELSCOPE,
    'preprocessor': 'resolution=, center_crop=, random_flip=, image_interpolation_mode=',
    'optimizers': 'optimizer= (a built one or a dict) and lr_config=',
    'callbacks': 'custom_hooks=[...]',
    'use_fp16': "optimizer_config=dict(precision='fp16')",
}

# Flags the trainer takes under their diffusers name although they are not its arguments.
FOREIGN = [name for name, (kind, _) in FLAGS.items() if kind != 'same'] + list(MODELSCOPE_ARGUMENTS)


_ADAM = {'learning_rate': 'lr', 'adam_weight_decay': 'weight_decay', 'adam_epsilon': 'eps'}
_ADAM_DEFAULTS = dict(lr=5e-4, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)  # the script's defaults


def _fill(target, key, value, flag, where):
    """Set ``target[key] = value`` for diffusers' ``--flag``; the same value given the
    hookloop way too is fine (a helper variable used in it), a different one is an error."""
    if target.get(key) is not None and target[key] != value:
        raise ConfigError(f"dreambooth_diffusion: diffusers' --{flag}={value!r} and {where}={target[key]!r} "
                          'disagree; give one of them')
    target[key] = value


def take_diffusers_flags(kwargs, train_dataloader=None):
    """Pop the diffusers-only flag names from ``kwargs``: ``'works'`` ones are turned into
    hookloop arguments (in ``kwargs``, or the returned dict for ``model`` and
    ``train_dataloader``); every other one is a ConfigError naming hookloop's spelling.
    ``kwargs`` is checked whole before any change, so one error names the first offending flag."""
    for name in [name for name in FOREIGN if name in kwargs]:
        if kwargs[name] is None or (kwargs[name] is False and FLAGS.get(name, ('',))[0] == 'unsupported'):
            del kwargs[name]  # a ported config's unset flag, or an unsupported switch left off: nothing to do
    given = [name for name in FOREIGN if name in kwargs]
    for name in given:
        if name in MODELSCOPE_ARGUMENTS:
            raise ConfigError(f"dreambooth_diffusion: ModelScope's {name}= is not an argument here; write "
                              f'{MODELSCOPE_ARGUMENTS[name]}')
        kind, text = FLAGS[name]
        if kind == 'spelt':
            raise ConfigError(f"dreambooth_diffusion: diffusers' --{name} is spelt {text} here")
        if kind == 'unsupported':
            raise ConfigError(f"dreambooth_diffusion: diffusers' --{name} is not supported: {text}")
    out = {}
    if 'pretrained_model_name_or_path' in kwargs:
        out['model'] = kwargs.pop('pretrained_model_name_or_path')
    if 'output_dir' in kwargs:
        _fill(kwargs, 'work_dir', kwargs.pop('output_dir'), 'output_dir', 'work_dir')
    if 'max_train_steps' in kwargs:
        _fill(kwargs, 'max_iters', kwargs.pop('max_train_steps'), 'max_train_steps', 'max_iters')
    if 'mixed_precision' in kwargs:
        precision = kwargs.pop('mixed_precision')
        if precision not in ('no', 'fp16', 'bf16'):
            raise ConfigError(f"dreambooth_diffusion mixed_precision must be 'no', 'fp16' or 'bf16', got {precision!r}")
        config = dict(kwargs.get('optimizer_config') or {})
        _fill(config, 'precision', None if precision == 'no' else precision, 'mixed_precision',
              'optimizer_config.precision')
        kwargs['optimizer_config'] = config
    loader = {'train_batch_size': 'batch_size', 'dataloader_num_workers': 'num_workers'}
    if any(flag in kwargs for flag in loader):
        train_dataloader = dict(train_dataloader or {})
        for flag, key in loader.items():
            if flag in kwargs:
                _fill(train_dataloader, key, kwargs.pop(flag), flag, f'train_dataloader.{key}')
        out['train_dataloader'] = train_dataloader
    adam = [flag for flag in ('learning_rate', 'adam_beta1', 'adam_beta2', 'adam_weight_decay', 'adam_epsilon')
            if flag in kwargs]
    if adam:
        given = kwargs.get('optimizer')
        if given is not None and not isinstance(given, Mapping):
            raise ConfigError(f"dreambooth_diffusion: diffusers' --{adam[0]} configures the optimizer; give optimizer "
                              'as a config dict, or drop the flag')
        optimizer = dict(type='AdamW', **_ADAM_DEFAULTS) if given is None else dict(given)
        if given is not None and optimizer.get('type', 'AdamW') not in ('AdamW', 'Adam'):
            raise ConfigError(f"dreambooth_diffusion: diffusers' --{adam[0]} sets AdamW, but optimizer is "
                              f"{optimizer.get('type')!r}")
        betas = list(optimizer.get('betas', _ADAM_DEFAULTS['betas']))
        for flag in adam:
            value = kwargs.pop(flag)
            if flag in _ADAM:
                key = _ADAM[flag]
                if given is None:
                    optimizer[key] = value
                else:
                    _fill(optimizer, key, value, flag, f'optimizer.{key}')
            else:
                index = 0 if flag == 'adam_beta1' else 1
                if given is not None and 'betas' in given and betas[index] != value:
                    raise ConfigError(f"dreambooth_diffusion: diffusers' --{flag}={value!r} and optimizer.betas="
                                      f"{tuple(given['betas'])!r} disagree; give one of them")
                betas[index] = value
        if given is None or 'adam_beta1' in adam or 'adam_beta2' in adam:
            optimizer['betas'] = tuple(betas)
        kwargs['optimizer'] = optimizer
    steps = kwargs.pop('checkpointing_steps', None)
    limit = kwargs.pop('checkpoints_total_limit', None)
    if steps is not None or limit is not None:
        config = kwargs.get('checkpoint_config')
        if config is not None:
            raise ConfigError('dreambooth_diffusion: give checkpointing_steps / checkpoints_total_limit or '
                              'checkpoint_config, not both')
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ConfigError(f'dreambooth_diffusion checkpointing_steps must be a positive int, got {steps!r}')
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigError(f'dreambooth_diffusion checkpoints_total_limit must be a positive int, got {limit!r}')
        config = dict(interval=steps or DEFAULT_CHECKPOINT_INTERVAL, by_epoch=False)
        if limit is not None:
            config['max_keep_ckpts'] = limit
        kwargs['checkpoint_config'] = config
        out['checkpoint_config'] = config
    return out


DEFAULT_CHECKPOINT_INTERVAL = 500  # diffusers' --checkpointing_steps default


def with_foreign_flags(init):
    """``init``'s signature plus the diffusers-only flags as keyword-only arguments, so
    config checks (and the MMCV translation, which drops unknown names as helper
    variables) hand them to the trainer, which accepts or refuses each."""
    import inspect
    signature = inspect.signature(init)
    params = list(signature.parameters.values())
    var_kw = [p for p in params if p.kind is p.VAR_KEYWORD]
    rest = [p for p in params if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in params}
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
             for name in FOREIGN if name not in taken]
    init.__signature__ = signature.replace(parameters=rest + extra + var_kw)
    return init
