"""The hook-profiling report: which hook spends how long in which stage.

With ``Trainer(profile_hooks=True)`` (``hookloop train --profile-hooks``) the trainer
times every hook method it calls into ``trainer.hook_timings[(hook, stage)] = [seconds,
calls]``. Each logger hook, as it closes (``after_run``, before ``close``), is handed
:func:`profile_record` through its ``log_profile(trainer, record)`` (the text logger writes it to
its JSON log as one ``{"mode": "profile", ...}`` object); after the run
:func:`report_hook_timings` prints the whole run's table. Nothing here writes a logger's file.
"""


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


def profile_record(trainer):
    """The profile so far as a log record ``{'mode': 'profile', 'iter', 'hooks': rows}``, or None
    without ``profile_hooks`` (rank 0 only: the loggers write there)."""
    if not trainer.profile_hooks or trainer.rank != 0:
        return None
    return {'mode': 'profile', 'iter': trainer.iter, 'hooks': timing_rows(trainer.hook_timings)}


def report_hook_timings(trainer):
    """Log the table of the whole run (rank 0)."""
    if trainer.rank != 0:
        return
    rows = timing_rows(trainer.hook_timings)
    trainer.logger.info('time spent in hooks, slowest first:\n%s', format_timing_table(rows))
