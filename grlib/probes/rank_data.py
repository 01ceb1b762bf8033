"""One rank's data path in this fresh process (the child of grlib.experiments.rank_share):

    python -m grlib.probes.rank_data SPEC.json

SPEC: {"loader": "whole" | "share", "rank", "world", "scale", "overrides", "folder", "arrays",
"steps", "batch_size", "result"}. Loads the data, plans `steps` global batches as rank `rank` of
`world` (0: one epoch), reads one validation pass; writes VmRSS before loading, the peak (VmHWM)
after the steps and after the validation pass, the seconds and the plans' checksum to
SPEC["result"] as JSON."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from grlib.probes.rss import status_mb


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import numpy as np

    from grlib.config import load_config
    from grlib.data.sequences import SequenceData
    from grlib.data.share import MappedSequences
    from grlib.distributed.data_parallel import Planner
    from grlib.negatives import build_negative_path

    cfg = load_config(spec["scale"], spec["overrides"])
    before = status_mb("VmRSS")
    t0 = time.perf_counter()
    data = (SequenceData.load(Path(spec["folder"])) if spec["loader"] == "whole"
            else MappedSequences(Path(spec["arrays"]), global_batches=True))
    path = build_negative_path(cfg.negatives, data.n_items, data.train_item_counts(), seed=cfg.train.seed)
    planner = Planner(path, spec["rank"], spec["world"], "lpt", seed=cfg.train.seed)
    load_s, t1 = time.perf_counter() - t0, time.perf_counter()
    steps = spec["steps"] or data.n_train_batches(spec["batch_size"])
    check, done = 0, 0
    for batch in data.train_batches(spec["batch_size"], cfg.data.max_len, np.random.default_rng(cfg.train.seed)):
        if done == steps:
            break
        plan = planner(batch)
        check = (check * 1_000_003 + int(plan.fingerprint.sum()) + int(plan.local.item_ids.sum())
                 + int(plan.local.targets.sum()) + int(plan.token_index.sum())) % (2**61 - 1)
        done += 1
    steps_s, hwm_train = time.perf_counter() - t1, status_mb("VmHWM")
    for batch in data.eval_batches("val", cfg.train.eval_batch_size, cfg.data.max_len):
        check = (check * 1_000_003 + int(batch.item_ids.sum()) + int(batch.eval_targets.sum())) % (2**61 - 1)
    result = {"before_mb": before, "hwm_train_mb": hwm_train, "hwm_eval_mb": status_mb("VmHWM"),
              "rss_end_mb": status_mb("VmRSS"), "load_s": load_s, "steps_s": steps_s, "steps": done,
              "checksum": check}
    Path(spec["result"]).write_text(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m grlib.probes.rank_data SPEC.json (run `python -m grlib bench data --rank-share`)")
    main(sys.argv[1])
