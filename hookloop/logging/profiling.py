"""The hook-profiling report: which hook spends how long in which stage.

With ``Trainer(profile_hooks=True)`` (``hookloop train --profile-hooks``) the trainer
times every hook method it calls into ``trainer.hook_timings[(hook, stage)] = [seconds,
calls]``; at the end of the run :func:`report_hook_timings` prints the table and
appends it to the JSON log as one ``{"mode": "profile", ...}`` object.
"""
import os


def timing_rows(hook_timings):
    """The table's rows, slowest first: dicts with hook, stage, calls, total_s, mean_us, percent
    (of all time spent in hooks)."""
    total = sum(seconds for seconds, _ in hook_timings.values()) or 1.0
    rows = [{'hook': hook, 'stage': stage, 'calls': calls, 'total_s': seconds,
             'mean_us': seconds / calls * 1e6 if calls else 0.0, 'percent': 100.0 * seconds / total}
            for (hook, stage), (seconds, calls) in hook_timings.items() if calls]
    return sorted(rows, key=lambda row: -row['total_s'])


def format_timing_table(rows):
    """A fixed-width text table of :func:`timing_rows`, with a total line."""
    if not rows:
        return '(no hook was called)'
    hook_w = max(len('hook'), *(len(r['hook']) for r in rows))
    stage_w = max(len('stage'), *(len(r['stage']) for r in rows))
    lines = [f'{"hook":<{hook_w}}  {"stage":<{stage_w}}  {"calls":>8}  {"total s":>10}  {"mean us":>10}  {"%":>6}']
    for r in rows:
        lines.append(f'{r["hook"]:<{hook_w}}  {r["stage"]:<{stage_w}}  {r["calls"]:>8}  {r["total_s"]:>10.4f}  '
                     f'{r["mean_us"]:>10.1f}  {r["percent"]:>6.1f}')
    total = sum(r['total_s'] for r in rows)
    lines.append(f'{"total":<{hook_w}}  {"":<{stage_w}}  {sum(r["calls"] for r in rows):>8}  {total:>10.4f}')
    return '\n'.join(lines)


def report_hook_timings(trainer):
    """Log the table (rank 0) and append it to ``<work_dir>/<timestamp>.log.json`` when that exists."""
    from ..hooks.loggers.text import append_json, json_log_path
    if trainer.rank != 0:
        return
    rows = timing_rows(trainer.hook_timings)
    trainer.logger.info('time spent in hooks, slowest first:\n%s', format_timing_table(rows))
    path = json_log_path(trainer)
    if os.path.exists(path):
        append_json(path, {'mode': 'profile', 'iter': trainer.iter, 'hooks': rows})
