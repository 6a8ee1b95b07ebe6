"""``hookloop plot WORK_DIR [WORK_DIR ...] [--keys loss,lr] -o curves.png``: curves from JSON logs.

One panel per key, one line per work dir (several runs overlaid), x = iterations
completed. A work dir's JSON logs are stitched in order (a resumed run is one curve); files
that could not be used are named, with the reason. Training values are lines; a key that only validation logs (or
``val/<key>``) is drawn from the validation records, with markers.
"""
import argparse
import glob
import json
import os

from ..errors import ConfigError


def _read_lines(path):
    records = []
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f'line {number} is not JSON') from None
    return records


def read_json_logs(work_dir):
    """``(records, skipped)``: the records of every ``*.log.json`` of ``work_dir`` (or of the
    one file given) in the order the runs wrote them (file names are run timestamps), so a
    resumed run continues the curve of the run before it; ``skipped`` lists
    ``(path, why)`` for files that were not used."""
    if os.path.isfile(work_dir):
        paths = [work_dir]
    else:
        paths = sorted(glob.glob(os.path.join(work_dir, '*.log.json')))
        if not paths:
            raise ConfigError(f'hookloop plot: no *.log.json in {work_dir!r} (is it a work dir?)')
    records, skipped = [], []
    for path in paths:
        try:
            found = _read_lines(path)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            if len(paths) == 1:
                raise ConfigError(f'hookloop plot: {path}: {exc}') from None
            skipped.append((path, str(exc)))
            continue
        events = [r for r in found if isinstance(r, dict) and r.get('mode') in ('train', 'val')]
        if not events:
            skipped.append((path, 'no train or val records (a run that logged nothing)'))
        records += events
    # A run resumed from an earlier checkpoint logs some iterations again: the later run wins.
    latest = {}
    for record in records:
        latest[(record['mode'], record.get('iter'))] = record
    return sorted(latest.values(), key=lambda r: (r.get('iter', 0), r['mode'] != 'train')), skipped


def curve(records, key):
    """``(steps, values, mode)`` of ``key`` (``'val/mse'`` forces validation), or None."""
    mode, name = key.split('/', 1) if key.startswith(('train/', 'val/')) else (None, key)
    for candidate in ([mode] if mode else ['train', 'val']):
        points = [(r['iter'], r[name]) for r in records
                  if r.get('mode') == candidate and isinstance(r.get(name), (int, float)) and 'iter' in r]
        if points:
            return [s for s, _ in points], [v for _, v in points], candidate
    return None


def plot(work_dirs, keys, output, title=None):
    """Draw and save the figure; returns the (key, label) pairs drawn."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    runs, notes = [], []
    for directory in work_dirs:
        records, skipped = read_json_logs(directory)
        runs.append((os.path.basename(os.path.normpath(directory)) or directory, (None, records)))
        notes += [f'skipped {path}: {why}' for path, why in skipped]
    for key in keys:
        if not any(curve(records, key) for _, (_, records) in runs):
            known = sorted({k if r['mode'] == 'train' else f'val/{k}' for _, (_, records) in runs
                            for r in records if r.get('mode') in ('train', 'val')
                            for k, v in r.items() if isinstance(v, (int, float)) and k not in
                            ('epoch', 'iter', 'inner_iter')})
            raise ConfigError(f'hookloop plot: no run logs {key!r}; logged keys: {", ".join(known) or "none"}')
        notes += [f'{directory}: no {key!r} logged, not drawn in that panel'
                  for directory, (_, (_, records)) in zip(work_dirs, runs) if curve(records, key) is None]
    figure, axes = plt.subplots(len(keys), 1, figsize=(7, 2.6 * len(keys)), sharex=True, squeeze=False)
    drawn = []
    for axis, key in zip(axes[:, 0], keys):
        for label, (_, records) in runs:
            found = curve(records, key)
            if found is None:
                continue
            steps, values, mode = found
            axis.plot(steps, values, marker='o' if mode == 'val' else None, markersize=3,
                      label=label if mode == 'train' else f'{label} (val)')
            drawn.append((key, label))
        axis.set_ylabel(key)
        axis.grid(alpha=0.3)
        axis.legend(fontsize='small')
    axes[-1, 0].set_xlabel('iterations completed')
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise ConfigError(f'hookloop plot: the output directory {directory!r} does not exist')
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return drawn, notes


def _run(args):
    keys = [k.strip() for k in args.keys.split(',') if k.strip()]
    if not keys:
        raise ConfigError('hookloop plot: --keys is empty')
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError('hookloop plot needs matplotlib: pip install matplotlib') from None
    _, notes = plot(args.work_dirs, keys, args.output, args.title)
    for note in notes:
        print(f'hookloop plot: {note}')
    print(f'wrote {args.output}')
    return 0


def register(subparsers):
    parser = subparsers.add_parser('plot', help='draw training curves from the JSON logs of work dirs')
    parser.add_argument('work_dirs', nargs='+', metavar='WORK_DIR',
                        help='work dirs (all their *.log.json, stitched in order) or .log.json files; several are overlaid')
    parser.add_argument('--keys', default='loss',
                        help="comma-separated metrics, e.g. loss,lr,val/mse (default: loss)")
    parser.add_argument('-o', '--output', default='curves.png', help='the image to write (default: curves.png)')
    parser.add_argument('--title', help='a title over the figure')
    parser.add_argument('--debug', action='store_true', default=argparse.SUPPRESS)
    parser.set_defaults(run=_run)

