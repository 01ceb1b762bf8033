"""Programs a measurement runs in a fresh process, or on a bare machine: each imports what it measures
and no more (no altair, which the package grlib.experiments loads, and no polars where it is not
measured), so that a child's peak resident set counts the data it holds, not our charts.

    rss          this process's resident set and its peak (/proc/self/status)
    preprocess   one preprocessing run (streaming or in memory): `bench data`'s child
    rank_data    one rank's data path (load, plan, validate): `bench data --rank-share`'s child
    device_check the CUDA paths on a bare GPU machine (`make device-check`)
"""
