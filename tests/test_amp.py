"""Mixed precision: fp16 (autocast + GradScaler) and bf16 against plain PyTorch loops, and the
MMCV ``auto_fp16`` / ``force_fp32`` model API."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from hookloop import ConfigError, Hook, Trainer
from hookloop.optim.amp import auto_fp16, cast_tensor_type, force_fp32
from conftest import Regressor, regression_data

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')


class ScaleRecorder(Hook):
    PRIORITY = 'LOWEST'

    def __init__(self):
        self.scales = []

    def after_train_iter(self, trainer):
        trainer.meters.keys()  # a read: the values appended since the last one join the buffer
        self.scales = list(trainer.meters._values.get('loss_scale', []))


def fresh_pair(model_type=Regressor, device='cpu'):
    torch.manual_seed(0)
    model, reference = model_type().to(device), model_type().to(device)
    reference.load_state_dict(model.state_dict())
    return model, reference


def train(tmp_path, model, optimizer_config, epochs=2, device='cpu', hooks=()):
    trainer = Trainer(model, optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
                      train_dataloader=DataLoader(regression_data(), batch_size=8), max_epochs=epochs,
                      work_dir=tmp_path, seed=0, device=device, optimizer_config=optimizer_config,
                      custom_hooks=list(hooks), log_config=dict(interval=1000))
    trainer.train()
    trainer.close()
    return trainer


def plain_amp_loop(reference, dtype, epochs=2, device='cpu', scaler=None, static_scale=None, clip=None):
    """The loop from the PyTorch AMP recipe; returns the scale after every step."""
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    scales = []
    for _ in range(epochs):
        for x, y in DataLoader(regression_data(), batch_size=8):
            x, y = x.to(device), y.to(device)
            with torch.autocast(torch.device(device).type, dtype=dtype):
                loss = reference(x, y)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                if clip is not None:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(reference.parameters(), clip)
                scaler.step(optimizer)
                scaler.update(new_scale=static_scale)
                scales.append(scaler.get_scale())
            optimizer.zero_grad()
    return scales


def assert_same_weights(model, reference):
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


def test_fp16_dynamic_scale_matches_plain_loop_with_overflow_and_growth(tmp_path):
    model, reference = fresh_pair()
    recorder = ScaleRecorder()
    # 2**18 overflows the fp16 activations' gradients: steps are skipped and the scale backs
    # off until it fits; growth_interval=2 then lets it grow again.
    scale = dict(init_scale=2. ** 18, growth_factor=2., backoff_factor=0.5, growth_interval=2)
    train(tmp_path, model, dict(precision='fp16', loss_scale=scale), hooks=[recorder])
    scales = plain_amp_loop(reference, torch.float16,
                            scaler=torch.amp.GradScaler('cpu', **scale))
    assert_same_weights(model, reference)
    logged = [t.item() for t in recorder.scales]
    assert logged == scales
    assert any(b < a for a, b in zip(scales, scales[1:])), 'no overflow happened: the test proves nothing'
    assert any(b > a for a, b in zip(scales, scales[1:])), 'the scale never grew'


def test_fp16_static_scale_stays_fixed_like_mmcv(tmp_path):
    model, reference = fresh_pair()
    recorder = ScaleRecorder()
    train(tmp_path, model, dict(type='Fp16OptimizerHook', loss_scale=1024.), hooks=[recorder])
    scales = plain_amp_loop(reference, torch.float16, scaler=torch.amp.GradScaler('cpu', init_scale=1024.),
                            static_scale=1024.)
    assert_same_weights(model, reference)
    assert [t.item() for t in recorder.scales] == scales == [1024.] * 10


def test_fp16_static_scale_skips_overflowing_steps(tmp_path):
    model, reference = fresh_pair()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train(tmp_path, model, dict(precision='fp16', loss_scale=2. ** 40))
    plain_amp_loop(reference, torch.float16, scaler=torch.amp.GradScaler('cpu', init_scale=2. ** 40),
                   static_scale=2. ** 40)
    assert_same_weights(model, reference)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # every step overflowed


def test_fp16_clipping_unscales_first(tmp_path):
    model, reference = fresh_pair()
    train(tmp_path, model, dict(precision='fp16', loss_scale='dynamic', grad_clip=dict(max_norm=0.3)))
    plain_amp_loop(reference, torch.float16, scaler=torch.amp.GradScaler('cpu'), clip=0.3)
    assert_same_weights(model, reference)


def test_bf16_matches_plain_autocast(tmp_path):
    model, reference = fresh_pair()
    trainer = train(tmp_path, model, dict(precision='bf16'))
    plain_amp_loop(reference, torch.bfloat16)
    assert_same_weights(model, reference)
    assert 'loss_scale' not in trainer.meters  # no scaler under bf16


def test_fp16_scaler_state_is_in_the_hook_state(tmp_path):
    model, _ = fresh_pair()
    trainer = train(tmp_path, model, dict(precision='fp16', loss_scale=dict(init_scale=2. ** 24)))
    state = trainer.state_dict()['hooks']['OptimizerHook']
    assert state['scaler']['scale'] < 2. ** 24 and 'grads' not in state  # backed off; no window open


# -- the MMCV model API ----------------------------------------------------------------------
class MMCVStyle(nn.Module):
    """A detector-style model: fp16 body, fp32 loss, switched by ``fp16_enabled``."""

    def __init__(self):
        super().__init__()
        self.fp16_enabled = False
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.seen = []

    @auto_fp16(apply_to=('x',))
    def forward(self, x, y):
        return self.loss(self.net(x), y)

    @force_fp32(apply_to=('prediction',))
    def loss(self, prediction, y):
        self.seen.append((prediction.dtype, torch.is_autocast_enabled('cpu')))
        return nn.functional.mse_loss(prediction, y)


def test_decorators_do_nothing_unless_fp16_enabled():
    model = MMCVStyle()
    x, y = regression_data()[:8]
    model(x, y)
    assert model.seen == [(torch.float32, False)]
    model.fp16_enabled = True
    model(x, y)
    assert model.seen[1] == (torch.float32, False)  # force_fp32 cast the fp16 prediction back, autocast off


def test_auto_fp16_casts_only_apply_to_and_out_fp32():
    class Net(nn.Module):
        fp16_enabled = True

        @auto_fp16(apply_to=('a',), out_fp32=True)
        def forward(self, a, b):
            self.dtypes = (a.dtype, b.dtype, torch.is_autocast_enabled('cpu'))
            return a * 2

    net = Net()
    out = net(torch.ones(2), b=torch.ones(2))
    assert net.dtypes == (torch.float16, torch.float32, True) and out.dtype == torch.float32
    with pytest.raises(ConfigError, match=r"auto_fp16\(apply_to=\['z'\]\) on .*no argument named \['z'\]"):
        auto_fp16(apply_to=('z',))(Net.forward.__wrapped__)


def test_cast_tensor_type_walks_containers():
    value = {'a': [torch.ones(1), (torch.ones(1, dtype=torch.int64), 'x')]}
    cast = cast_tensor_type(value, torch.float32, torch.float16)
    assert cast['a'][0].dtype == torch.float16 and cast['a'][1][0].dtype == torch.int64 and cast['a'][1][1] == 'x'


def test_fp16_with_mmcv_model_matches_manual_loop(tmp_path):
    model, reference = fresh_pair(MMCVStyle)
    scale = dict(init_scale=2. ** 16)
    train(tmp_path, model, dict(type='Fp16OptimizerHook', loss_scale=scale))
    assert model.fp16_enabled and model.seen[-1] == (torch.float32, False)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler('cpu', **scale)
    for _ in range(2):
        for x, y in DataLoader(regression_data(), batch_size=8):
            with torch.autocast('cpu', dtype=torch.float16):
                prediction = reference.net(x.half())
            loss = nn.functional.mse_loss(prediction.float(), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    assert_same_weights(model, reference)


# -- CUDA (skipped without a GPU; bench/gpu_amp.py covers a convnet) --------------------------
@cuda
@pytest.mark.parametrize('precision, dtype', [('fp16', torch.float16), ('bf16', torch.bfloat16)])
def test_cuda_amp_matches_plain_loop(tmp_path, precision, dtype):
    model, reference = fresh_pair(device='cuda')
    cfg = dict(precision=precision)
    if precision == 'fp16':
        cfg['loss_scale'] = dict(init_scale=2. ** 24, growth_interval=3)
    train(tmp_path, model, cfg, device='cuda')
    scaler = torch.amp.GradScaler('cuda', init_scale=2. ** 24, growth_interval=3) if precision == 'fp16' else None
    plain_amp_loop(reference, dtype, device='cuda', scaler=scaler)
    assert_same_weights(model, reference)


def test_validation_forward_uses_the_same_autocast(tmp_path):
    model = Regressor()
    trainer = train(tmp_path, model, dict(precision='bf16'), epochs=1)
    with trainer.step.val_forward_context():
        prediction = model(torch.ones(2, 4))
    assert prediction.dtype == torch.bfloat16
    with trainer.step.forward_context():  # the train forward too
        assert torch.is_autocast_enabled('cpu') and torch.get_autocast_dtype('cpu') == torch.bfloat16
