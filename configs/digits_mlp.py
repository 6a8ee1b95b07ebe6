# Trains a small MLP on scikit-learn's bundled digits on the CPU in a few seconds
# (about 97% validation accuracy).  hookloop train configs/digits_mlp.py
custom_imports = ['hookloop.examples.digits']
model = dict(type='DigitsMLP', hidden=128)
train_dataloader = dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=32, shuffle=True)
val_dataloader = dict(dataset=dict(type='DigitsDataset', split='val'), batch_size=256)
val_evaluator = dict(type='Accuracy')
optimizer = dict(type='AdamW', lr=2e-3)
max_epochs = 15
seed = 0
device = 'cpu'
optimizer_config = dict()
lr_config = dict(policy='CosineAnnealing', min_lr=0, warmup='linear', warmup_iters=50)
checkpoint_config = dict(interval=5)
log_config = dict(interval=20, hooks=[dict(type='TextLoggerHook')])
evaluation = dict(interval=1)
work_dir = 'work_dirs/digits_mlp'
