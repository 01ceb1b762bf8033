"""grlib.data.share: a rank of a data-parallel run holds only the per-user arrays and the batches it
reads (never the dataset's token arrays), plans exactly what the whole read plans, reads only its own
sequences' tokens (plus the global targets for the negatives), and the per-step fingerprint check
still stops ranks that read different data."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grlib.config import NegativesConfig
from grlib.data.sequences import SequenceData
from grlib.data.share import GlobalBatch, MappedSequences, write_arrays
from grlib.distributed.data_parallel import Planner, check_same_batch
from grlib.distributed.launch import RankFailed, launch
from grlib.negatives import build_negative_path
from grlib.schema import DataError

TOKENS = ("item_ids", "actions", "timestamps", "offsets", "targets")


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """A small prepared synthetic twin: (whole read, flat arrays folder)."""
    from grlib.data.catalog import prepare_to
    from grlib.config import load_config
    import dataclasses

    root = tmp_path_factory.mktemp("share")
    data = dataclasses.replace(load_config("smoke").data, n_users=120, length_factor=0.01, max_len=64)
    prepare_to(data, root / "prepared")
    write_arrays(root / "prepared", root / "arrays", chunk_users=17)  # several chunks
    return SequenceData.load(root / "prepared"), root / "arrays"


class CountingReads(MappedSequences):
    """MappedSequences that records every token range it reads."""

    def _tokens(self, name, starts, ends):
        self.reads.setdefault(name, []).extend(zip(np.asarray(starts).tolist(), np.asarray(ends).tolist()))
        return super()._tokens(name, starts, ends)


def test_a_rank_holds_no_token_array_of_the_dataset(twin):
    whole, arrays = twin
    data = MappedSequences(arrays, global_batches=True)
    held = sum(v.nbytes for v in vars(data).values() if isinstance(v, np.ndarray))
    assert held == (2 * data.n_users + data.n_users + 1) * 8  # val_pos, test_pos, user_offsets: nothing else
    assert data.n_events == whole.user_offsets[-1] > 10 * data.n_users
    for name in SequenceData.TOKEN_ARRAYS:
        with pytest.raises(AttributeError, match="keeps no token array"):
            getattr(data, name)


def test_the_share_reads_equal_the_whole_read(twin):
    whole, arrays = twin
    data = MappedSequences(arrays, global_batches=True)
    assert np.array_equal(data.train_item_counts(chunk_events=50), whole.train_item_counts())
    for a, g in zip(whole.train_batches(16, 8, np.random.default_rng(3)),
                    data.train_batches(16, 8, np.random.default_rng(3))):
        assert isinstance(g, GlobalBatch) and torch.equal(a.offsets, g.offsets)
        assert torch.equal(a.targets, g.targets)
        b = g.materialize()
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in TOKENS)
        rows = [g.batch_size - 1, 0] if g.batch_size > 1 else [0]
        assert all(torch.equal(getattr(a.select(rows), f), getattr(g.select(rows), f)) for f in TOKENS)
    for a, b in zip(whole.eval_batches("test", 32, 8), data.eval_batches("test", 32, 8)):
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in TOKENS)
        assert torch.equal(a.eval_targets, b.eval_targets)
        assert all(np.array_equal(x, y) for x, y in zip(a.history, b.history, strict=True))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("sampler", ["uniform", "in-batch"])
def test_each_rank_plans_what_the_whole_read_plans_reading_only_its_sequences(twin, world, sampler):
    whole, arrays = twin
    data = CountingReads(arrays, global_batches=True)
    neg = NegativesConfig(n_negatives=4, sampler=sampler)
    counts = whole.train_item_counts()
    for rank in range(world):
        mk = lambda: Planner(build_negative_path(neg, whole.n_items, counts, seed=1), rank, world, "lpt", seed=1)  # noqa: E731
        p_whole, p_share = mk(), mk()
        data.reads = {}
        wanted = set()
        for a, g in zip(whole.train_batches(12, 16, np.random.default_rng(0)),
                        data.train_batches(12, 16, np.random.default_rng(0))):
            x, y = p_whole(a), p_share(g)
            assert torch.equal(x.fingerprint, y.fingerprint) and torch.equal(x.token_index, y.token_index)
            assert x.weight == y.weight and x.total_tokens == y.total_tokens
            assert all(torch.equal(getattr(x.local, f), getattr(y.local, f)) for f in TOKENS)
            sx, sy = (p.local.attachments["negatives"].sample for p in (x, y))
            assert torch.equal(sx.keep, sy.keep) and torch.equal(sx.targets, sy.targets) and torch.equal(sx.ids, sy.ids)
            rows = torch.searchsorted(g.offsets[1:], x.token_index, right=True).unique().numpy()  # the rank's rows
            wanted |= {(int(s), int(e)) for s, e in zip(g._a[rows], g._b[rows]) if e > s}
        # actions and timestamps: only the rank's own windows are read (items and flags also feed the
        # global targets of the negatives' draw)
        for name in ("actions", "timestamps"):
            got = {(s, e) for s, e in data.reads[name] if e > s}
            assert got == wanted, name


def test_a_damaged_array_file_is_refused_with_its_name(twin, tmp_path):
    import shutil

    _, arrays = twin
    copy = tmp_path / "arrays"
    shutil.copytree(arrays, copy)
    with open(copy / "actions.bin", "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(DataError, match="actions.bin: 10 bytes"):
        MappedSequences(copy)


def _share_ranks_with_other_data(runtime, arrays, seeds):
    """Each rank reads its share of the same arrays in its own order: the fingerprint check must stop them."""
    data = MappedSequences(arrays, global_batches=True)
    rank = runtime.topology.rank
    batch = next(data.train_batches(8, 64, np.random.default_rng(seeds[rank])))  # ragged windows
    path = build_negative_path(NegativesConfig(n_negatives=2), data.n_items, data.train_item_counts())
    plan = Planner(path, rank, 2)(batch)
    check_same_batch(plan.fingerprint, runtime.world_group)
    return plan.fingerprint.tolist()


def test_the_fingerprint_check_still_catches_ranks_that_read_different_batches(twin):
    _, arrays = twin
    same = launch(_share_ranks_with_other_data, 2, args=(str(arrays), [5, 5]), timeout_s=60)
    assert same[0] == same[1]  # the same order passes the check
    with pytest.raises(RankFailed, match="RankMismatch|different global batches"):
        launch(_share_ranks_with_other_data, 2, args=(str(arrays), [5, 6]), timeout_s=60)
