"""The simulator's latency profile for your machine: `timelyllm profile fit` fits one on a real
vLLM engine, `timelyllm profile check` checks the simulator with it against real serving.

    cli.py           the two commands' arguments (`add_parser`), `fit`'s checks of them
    fit.py           the fit: least squares >= 0 on measured or served iterations (decode and
                     prefill terms, host time between steps, request intake), the profile YAML
    measure.py       a live engine: micro-measurements, host costs (tokenise / detokenise),
                     serving the fit workloads' draws with every iteration recorded, saving them
    refit.py         a refit from saved iterations (one or several sessions), no engine
    check.py         the check: real runs (optionally an interleaved fit, speed probes), the
                     simulator replaying the real model's outputs
    check_report.py  its figures: per task type real vs simulated, the real runs' spread, steps
"""
