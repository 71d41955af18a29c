"""`labkit bench`: offline throughput of the engine (or of Transformers' generate as a baseline).

    workloads.py  workload files (workloads/bench/*.yaml) and their deterministic draws
    offline.py    the engine run: init, warm-up, timed repeats, medians, KV blocks, peak memory
    hf.py         the same workload through transformers' generate
    compare.py    B/A ratios of two bench JSONs that differ in one named variable
    command.py    the Typer sub-app (`labkit bench [run]`, `labkit bench compare`)
"""
