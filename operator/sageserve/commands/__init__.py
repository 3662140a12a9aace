"""Bodies of the `sageserve` commands and benchmarks: tables, progress bars, timing.

They sit beside `cli.py`, above every world in DESIGN.md's arrows, so the policy code and
the worlds stay free of presentation and benchmark code. `cli.py` imports these modules
inside each command function, which keeps `sageserve --help` instant.
"""
