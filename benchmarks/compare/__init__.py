"""Side-by-side benchmark: autotune vs DeepSpeed's own autotuner vs an exhaustive grid (benchmarks/compare_tuners.py).

Modules, in the order a run uses them:
    settings     what one benchmark run compares (model, grid, budgets, measurement)
    environment  machine, library versions, load average: the provenance every figure needs
    pipeline     the phases of one run, in order, returning the dict everything is written from
    launchers    the trial launcher autotune and the grid share
    exhaustive   every grid point as a real autotune trial
    ours         autotune's own search (tune()) over the same grid
    ds_autotuner DeepSpeed's `deepspeed --autotuning tune` over the same grid, and what it explored
    remeasure    every chosen config re-run with one fixed measurement, so throughputs compare
    latency      process wall time of a cached `autotune` CLI answer, and what its start-up spends
    records      what each method hands back (ChosenConfig, MethodRun, Remeasured)
    analysis     the memory-bound scenario's budget, and the ratios and targets per scenario
    output       JSON, PNG chart and markdown table
"""
