"""Simulations at scales this machine cannot run, each validated against a measured point first:
`balance` (load imbalance across data-parallel ranks), `alltoall` (alpha-beta all-to-all per link
class), `pipeline` (a discrete-event model of the schedules' steps) and `scaleout` (the per-rank work
of those steps at cluster scale)."""
