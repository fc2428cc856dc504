"""Run a compiled program a few more times under JAX's profiler, and read what it recorded.

`jax.profiler.start_trace` / `stop_trace` around N calls (each waited for, so one step is one run
of the program), into a temporary folder that is removed once read (xplane.py reads it). Nothing
is compiled here: the caller hands in a call of a program that already ran, and the trace is
filtered to that program's module. Donated arguments: each call can be handed fresh copies
(`fresh`), made before the call and outside the step.

Plain Python over public `jax.profiler` APIs; no IPython.
"""
from __future__ import annotations

import tempfile
import time

from ...errors import UsageError
from ...views.progress import Progress
from .xplane import Trace, read_trace, trace_file

STEP_NAME = "jaxpar_magic step"
MAX_STEPS = 100


def check_steps(steps, option: str = "--profile-steps") -> int:
    """A step count the profiler can run: a whole number from 1 to MAX_STEPS."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise UsageError(f"{option} {steps!r}: the profile runs the program that many more times; give a whole "
                         f"number from 1 to {MAX_STEPS} (5 by default), e.g. `{option} 5`.")
    return steps


def traced_steps(call, steps: int, module: str, fresh=None) -> tuple[Trace, list[float]]:
    """Run `call(*fresh())` (or `call()`) `steps` times under the profiler, waiting for each run;
    returns what the trace recorded of the program `module`, and each run's wall-clock seconds
    (from the call to its results being ready)."""
    import jax

    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # Python's own calls are not the step: leave them out of the trace
    options.host_tracer_level = 1  # XLA:CPU's ops are level-1 events; level 2 adds the runtime's own (measured: 10x more)
    walls = []
    with tempfile.TemporaryDirectory(prefix="jaxpar-profile-") as directory, Progress("profiling"):
        try:
            jax.profiler.start_trace(directory, profiler_options=options)
        except RuntimeError as err:  # "Profile has already been started", "Only one profile may be run at a time"
            raise UsageError(f"--profile: JAX's profiler is already recording ({err}); only one trace runs at a "
                             f"time. Stop yours (`jax.profiler.stop_trace()`), then profile the cell again.") from None
        try:
            for step in range(steps):
                arguments = fresh() if fresh is not None else ()
                with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step):
                    began = time.perf_counter()
                    jax.block_until_ready(call(*arguments))
                    walls.append(time.perf_counter() - began)
                del arguments
        finally:
            jax.profiler.stop_trace()
        trace = read_trace(trace_file(directory), module)
    return trace, walls
