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
    'output_dir': ('spelt', "work_dir=DIR (the LoRA file goes to <work_dir>/<pipeline_dir>, default 'pipeline')"),
    'seed': ('same', 'seed (the same RNG use as the script: docs/dreambooth.md)'),
    'resolution': ('same', "resolution (default: the model's native size; diffusers: 512)"),
    'center_crop': ('same', 'center_crop'),
    'train_text_encoder': ('same', 'train_text_encoder (with lora: LoRA adapters on the text encoder)'),
    'train_batch_size': ('spelt', 'train_dataloader=dict(batch_size=N) (default 1; diffusers: 4)'),
    'sample_batch_size': ('same', 'sample_batch_size'),
    'num_train_epochs': ('spelt', 'max_epochs=N'),
    'max_train_steps': ('spelt', 'max_iters=N'),
    'checkpointing_steps': ('works', 'checkpoint_config=dict(interval=N, by_epoch=False) (default every 500)'),
    'checkpoints_total_limit': ('works', 'checkpoint_config=dict(max_keep_ckpts=N)'),
    'resume_from_checkpoint': ('spelt', "resume_from=PATH, or 'hookloop train CONFIG --resume auto' for latest"),
    'gradient_accumulation_steps': ('spelt', 'optimizer_config=dict(cumulative_iters=N)'),
    'gradient_checkpointing': ('same', 'gradient_checkpointing'),
    'learning_rate': ('spelt', "optimizer=dict(type='AdamW', lr=...) (diffusers' default 5e-4)"),
    'scale_lr': ('same', 'scale_lr'),
    'lr_scheduler': ('spelt', "lr_config=dict(policy=...) ('constant': no lr_config)"),
    'lr_warmup_steps': ('spelt', "lr_config=dict(policy='Fixed', warmup='linear', warmup_iters=N, warmup_ratio=0.0) "
                                 "(diffusers' 'constant' schedule ignores it)"),
    'lr_num_cycles': ('spelt', "lr_config=dict(policy='CosineRestart', periods=[...], restart_weights=[...])"),
    'lr_power': ('spelt', "lr_config=dict(policy='Poly', power=...)"),
    'dataloader_num_workers': ('spelt', 'train_dataloader=dict(num_workers=N)'),
    'use_8bit_adam': ('same', 'use_8bit_adam'),
    'adam_beta1': ('spelt', "optimizer=dict(type='AdamW', betas=(beta1, beta2))"),
    'adam_beta2': ('spelt', "optimizer=dict(type='AdamW', betas=(beta1, beta2))"),
    'adam_weight_decay': ('spelt', "optimizer=dict(type='AdamW', weight_decay=...) (AdamW's default is 1e-2 too)"),
    'adam_epsilon': ('spelt', "optimizer=dict(type='AdamW', eps=...)"),
    'max_grad_norm': ('same', 'max_grad_norm'),
    'push_to_hub': ('unsupported', 'hookloop does not upload; upload <work_dir>/pipeline with huggingface-cli'),
    'hub_token': ('unsupported', 'hookloop does not upload; upload <work_dir>/pipeline with huggingface-cli'),
    'hub_model_id': ('unsupported', 'hookloop does not upload; upload <work_dir>/pipeline with huggingface-cli'),
    'logging_dir': ('spelt', 'work_dir (logs and TensorBoard events go under it)'),
    'allow_tf32': ('unsupported', 'set torch.backends.cuda.matmul.allow_tf32 in a module listed in custom_imports'),
    'report_to': ('spelt', "log_config=dict(hooks=[dict(type='TensorboardLoggerHook'), dict(type='WandbLoggerHook')])"),
    'mixed_precision': ('spelt', "optimizer_config=dict(precision='fp16'|'bf16')"),
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
    'image_interpolation_mode': ('same', 'image_interpolation_mode (lanczos by default with lora)'),
}

# Flags the trainer takes under their diffusers name although they are not its arguments.
FOREIGN = [name for name, (kind, _) in FLAGS.items() if kind != 'same']


def take_diffusers_flags(kwargs):
    """Pop the diffusers-only flag names from ``kwargs``: ``'works'`` ones are turned into
    hookloop arguments in ``kwargs`` (returned as a dict of what was set); every other one
    is a ConfigError naming hookloop's spelling. ``kwargs`` is checked whole before any
    change, so one error names the first offending flag."""
    for name in [name for name in FOREIGN if name in kwargs and kwargs[name] is None]:
        del kwargs[name]  # a ported config's unset flag: nothing to do
    given = [name for name in FOREIGN if name in kwargs]
    for name in given:
        kind, text = FLAGS[name]
        if kind == 'spelt':
            raise ConfigError(f"dreambooth_diffusion: diffusers' --{name} is spelt {text} here")
        if kind == 'unsupported':
            raise ConfigError(f"dreambooth_diffusion: diffusers' --{name} is not supported: {text}")
    out = {}
    if 'pretrained_model_name_or_path' in kwargs:
        out['model'] = kwargs.pop('pretrained_model_name_or_path')
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
