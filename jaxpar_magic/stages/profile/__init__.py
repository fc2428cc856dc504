"""The profile stage (`--profile`, `jaxpar_magic.profile`): a measured step beside the plan.
`profile_cell.py` runs a cell's compiled program (or a function) a few more times, `trace.py` under
JAX's profiler, `xplane.py` reads the trace (the one reader of that debug format), `ops.py` maps its
instruction names to the compiled program's text (kinds, lines), `summary.py` makes the `Profile`
(lanes, steps, ops, shares; `intervals.py` does the arithmetic), `state.py` its view state and
words, and `beside.py` puts the plan stage's estimate beside the measurement."""
