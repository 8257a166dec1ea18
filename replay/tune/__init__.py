"""``tokenpools tune``: search the settings for the best outcomes on a recorded log (docs/tuning.md#tokenpools-tune).

Modules, one idea each: ``outcomes`` (a replay's outcomes as a flat mapping, pure), ``space`` (the space file,
validated with lines), ``choose`` (the best point and the Pareto front, pure), ``trials`` (one trial: one
deterministic replay), ``executors`` (serial, a process pool, Ray), ``search`` (Optuna's ask-and-tell in fixed
batches), ``outputs`` (best.yaml, report.md, pareto.png, trials.csv) and ``cli`` (the command's shell).
"""
