"""The shipped example config trains to the accuracy the README promises."""
import os

from hookloop.cli import build_from_config

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'digits_mlp.py')


def test_digits_example_reaches_95_percent(tmp_path):
    trainer = build_from_config(CONFIG, work_dir=str(tmp_path))
    trainer.train()
    trainer.close()
    assert trainer.metrics['accuracy'] >= 95.0
    names = os.listdir(tmp_path)
    assert 'epoch_15.pth' in names and 'last_checkpoint' in names
    assert any(n.endswith('.log.json') for n in names) and any(n.endswith('.log') for n in names)
