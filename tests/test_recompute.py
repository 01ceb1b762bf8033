"""model.recompute_layers (activation checkpointing per HSTU layer): the outputs, the gradients of
every parameter and the RNG stream afterwards are those of the plain forward, dropout on, on random
ragged batches (empty and length-1 sequences included), through the fused kernel and the padded
reference, and under a data-parallel rank's global dropout rows; it keeps fewer activations."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.config import ConfigError, ModelConfig
from grlib.model import build_model, dropout as fast_dropout
from grlib.negatives.memory import PeakMemory

from test_model import N_ITEMS, make_batch


def _model(recompute: bool, impl: str, d: int = 16, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(name="hstu", n_layers=layers, n_heads=2, d_model=d, dropout=0.3, attention_impl=impl,
                      recompute_layers=recompute)
    return build_model(cfg, N_ITEMS, max_len=8).train()


def _run(m: torch.nn.Module, batch, seed: int) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """Output, every parameter's gradient, and the next draw of torch's generator after backward."""
    torch.manual_seed(seed)
    out = m(batch)  # [T, d]
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in m.named_parameters()}
    return out.detach(), grads, torch.randint(0, 2**31, (4,))


@pytest.mark.parametrize("impl", ["cpu", "reference"])
@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.integers(0, 8), min_size=1, max_size=4), seed=st.integers(0, 1000))
def test_recomputed_layers_give_the_plain_forward_and_gradients(impl, lengths, seed):
    batch = make_batch(lengths, max_len=8, seed=seed)
    plain = _run(_model(False, impl), batch, seed)
    again = _run(_model(True, impl), batch, seed)
    torch.testing.assert_close(again[0], plain[0], rtol=0, atol=0)
    assert again[1].keys() == plain[1].keys()
    for name, g in plain[1].items():
        if g is None:
            assert again[1][name] is None, name
        else:
            torch.testing.assert_close(again[1][name], g, rtol=0, atol=0, msg=name)
    assert torch.equal(again[2], plain[2])  # the generator is where the plain run left it


def test_a_rank_recomputes_with_its_global_rows():
    """Under global_rows (a data-parallel rank: the words of the global batch, the rank's rows kept),
    the recomputation in backward, which runs after that block has ended, draws the same rows."""
    batch = make_batch([5, 1, 0, 7], max_len=8, seed=3)
    T = batch.item_ids.numel()
    index = torch.arange(3, 3 + T)  # the rank's tokens sit at rows 3.. of a global batch of T + 6

    def run(recompute: bool):
        m = _model(recompute, "cpu")
        torch.manual_seed(11)
        with fast_dropout.global_rows(T + 6, index):
            out = m(batch)
        out.sum().backward()
        return out.detach(), [p.grad.clone() for p in m.parameters() if p.grad is not None]

    (o1, g1), (o2, g2) = run(False), run(True)
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    for a, b in zip(g2, g1, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_recompute_keeps_fewer_activations_and_is_refused_for_sasrec():
    batch = make_batch([8] * 32, max_len=8, seed=1)

    def peak(recompute: bool) -> int:  # 8 layers: 5.4 MB plain, 2.2 MB recomputed (0.40x) when written
        m = _model(recompute, "cpu", d=64, layers=8)
        with PeakMemory() as mem:
            m(batch).sum().backward()
        return mem.peak_bytes

    plain, recomputed = peak(False), peak(True)
    assert recomputed < 0.6 * plain, (recomputed, plain)
    with pytest.raises(ConfigError, match="model.recompute_layers"):
        ModelConfig(name="sasrec", recompute_layers=True)
