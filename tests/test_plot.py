import pytest

from hookloop.cli import main
from log_utils import make_trainer, run

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


@pytest.fixture(scope='module')
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp('runs')
    for name, lr in (('lr_0.05', 0.05), ('lr_0.01', 0.01)):
        trainer = make_trainer(root / name, [dict(type='TextLoggerHook')], interval=2, val=True,
                               evaluation=dict(interval=1))
        trainer.optimizer.param_groups[0]['lr'] = lr
        run(trainer)
    return root / 'lr_0.05', root / 'lr_0.01'


def test_plot_writes_a_png_with_one_line_per_run_and_key(two_runs, tmp_path):
    pytest.importorskip('matplotlib', reason='matplotlib is not installed')
    from hookloop.commands.plot import curve, plot, read_json_logs
    out = tmp_path / 'curves.png'
    assert main(['plot', *map(str, two_runs), '--keys', 'loss,lr,mse', '-o', str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    import matplotlib.image
    height, width = matplotlib.image.imread(str(out)).shape[:2]
    assert (width, height) == (700, 780)  # 3 panels of 7 x 2.6 inches at 100 dpi
    drawn, notes = plot(list(map(str, two_runs)), ['loss', 'val/mse'], str(tmp_path / 'b.png'))
    assert drawn == [('loss', 'lr_0.05'), ('loss', 'lr_0.01'), ('val/mse', 'lr_0.05'), ('val/mse', 'lr_0.01')]
    assert notes == []
    steps, values, mode = curve(read_json_logs(str(two_runs[1]))[0], 'lr')
    assert mode == 'train' and steps == list(range(2, 21, 2)) and set(values) == {0.01}


def test_plot_unknown_key_lists_the_logged_ones(two_runs, tmp_path, capsys):
    pytest.importorskip('matplotlib', reason='matplotlib is not installed')
    assert main(['plot', str(two_runs[0]), '--keys', 'los', '-o', str(tmp_path / 'x.png')]) == 1
    err = capsys.readouterr().err
    assert "no run logs 'los'; logged keys: data_time, loss, lr, momentum, time, val/mse" in err
    assert not (tmp_path / 'x.png').exists()


def test_plot_dir_without_log_is_a_clear_error(tmp_path, capsys):
    assert main(['plot', str(tmp_path), '-o', str(tmp_path / 'x.png')]) == 1
    assert f"no *.log.json in '{tmp_path}'" in capsys.readouterr().err
