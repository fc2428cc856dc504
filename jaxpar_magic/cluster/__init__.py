"""`%cluster`'s machinery, plain Python: the lifecycle (`lifecycle.py`: start, connect, stop,
restart), its status and errors (`status.py`), the watchdog that bounds every wait (`waits.py`),
what runs on the engines (`runs.py` in the kernel, `engine.py` in each process), the hang doctor,
the reaper of stray processes and the filter for Gloo's output."""
