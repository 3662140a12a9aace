"""`sageserve compare`: policies at equal SLO, each on the frontier of its own knobs.

At the paper's thresholds (70 / 30 % EMU, SageServe §7.1) the policies do not hold the same
SLO, so a GPU-hour difference says little. This package sweeps each policy's knob(s), runs
every point through the simulator's public entry points (`sim.scenario`, `sim.run`), keeps
the Pareto front of GPU-hours against IW-F SLO attainment and reads each policy's GPU-hours
at a target attainment off its front.

- `frontier`: the pure logic (front, interpolation at the target);
- `grid`: which knob each policy sweeps and the points to run;
- `runner`: the runs, in parallel on a local process pool or a Dask cluster;
- `output`: the summary JSON and the HTML report with the plot.
"""
