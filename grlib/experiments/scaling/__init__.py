"""The scaling stage (claims C5, C7; notebook 07_scaling), one module per part.

    stage       the stage's method: measure, model, table, views, acceptance (what the notebook calls)
    measured    what the launched gloo ranks run: the 2-rank steps per schedule, 1 -> 2 process scaling
    frames      rows and estimators of the measured steps (span rows, dedicated-core walls)
    validation  the pipeline model (grlib.sim.pipeline) against the measured steps
    cluster     TurboGR vs baseline at 8-1536 modelled ranks of the paper's presets, MFU per rank step
    charts      verdicts, views and charts (Gantt, utilisation)
"""
