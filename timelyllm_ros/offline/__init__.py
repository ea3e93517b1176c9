"""Offline planning for a known batch of requests (Hybrid offline-online scheduling, Pang et al.).

`makespan`  P||Cmax: assign requests to J concurrency slots minimising the largest slot load
            (LPT + local search, exact branch-and-bound for small instances, lower bounds).
`batch`     known-batch workload files (and a GSM8K-like generator for the paper's setting).
`pd_sim`    the paper's PD-competition simulator: baseline / offline / online / both.
`cli`       `timelyllm plan-offline BATCH`.
"""
