"""model.precision = bf16: HSTU's projections on bf16 copies of the fp32 weights (grlib.model.hstu), against
the fp32 model with the same weights; the fp32 path keeps no cast; the config refuses what it does not run."""
from __future__ import annotations

import re

import pytest
import torch

from grlib import ops
from grlib.hardware import isa
from grlib.config import ConfigError, ModelConfig, load_ablation, load_config
from grlib.model import build_model
from tests.test_model import N_ITEMS, make_batch


def _pair(impl: str = "cpu") -> tuple[torch.nn.Module, torch.nn.Module]:
    """The fp32 and bf16 HSTU with the same initial weights (the precision does not change the init)."""
    models = []
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        cfg = ModelConfig(name="hstu", n_layers=2, n_heads=2, d_model=32, dropout=0.0, attention_impl=impl,
                          precision=precision)
        models.append(build_model(cfg, N_ITEMS, max_len=16).train())
    return models[0], models[1]


# bf16 GEMMs need AVX512-BF16; without it (or under GRLIB_ISA=avx2) model.precision=bf16 is refused (tests/test_isa.py)
needs_bf16 = pytest.mark.skipif(isa.bf16_missing() is not None, reason=f"{isa.bf16_missing()}")


@needs_bf16
@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_bf16_projections_track_fp32_and_keep_fp32_masters(impl):
    fp32, bf16 = _pair(impl)
    for (name, a), b in zip(fp32.state_dict().items(), bf16.state_dict().values()):
        assert torch.equal(a, b), name
    seen = []
    bf16.layers[0].uvqk.register_forward_hook(lambda m, i, out: seen.append((i[0].dtype, out.dtype)))
    batch = make_batch([0, 1, 5, 16, 9], max_len=16)
    outs = []
    for m in (fp32, bf16):
        y = m(batch)  # [T, d]
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outs.append(y)
    # the input LayerNorm computed in fp32 and written in bf16 (grlib.ops.layer_norm's dtype: no cast of its
    # own); U, V, Q, K computed and held in bf16
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    assert outs[1].dtype == torch.float32 and outs[0].shape == outs[1].shape
    err = (outs[1] - outs[0]).abs().max().item()
    assert 0 < err < 0.05, err  # bf16 rounding (8-bit mantissa), not another function
    for (name, p32), p16 in zip(fp32.named_parameters(), bf16.parameters()):
        assert p16.dtype == torch.float32 and p16.grad is not None and p16.grad.dtype == torch.float32, name
        g32, g16 = p32.grad.flatten(), p16.grad.flatten()
        if g32.norm() > 0:
            cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0).item()
            assert cos > 0.98, (name, cos)


def test_fp32_projection_is_the_plain_linear_without_casts():
    fp32, _ = _pair()
    layer, x = fp32.layers[0].uvqk, torch.randn(7, 32, requires_grad=True)
    y = layer(x)
    assert torch.equal(y, ops.linear(x, layer.weight, layer.bias))
    assert "ToCopy" not in type(y.grad_fn).__name__ and all(
        "ToCopy" not in type(f).__name__ for f, _ in y.grad_fn.next_functions if f is not None)


@needs_bf16
def test_bf16_trains_a_few_steps_and_the_loss_falls():
    from grlib.experiments.mfu_steps import batches as _batches, build_schedule as _build_schedule

    cfg = load_config("smoke", {"model.precision": "bf16", "model.attention_impl": "cpu", "model.dropout": 0.0})
    data, batches = _batches(cfg, 12)
    schedule = _build_schedule(cfg, data)  # grlib.fit.assemble's one-process schedule, as bench train runs it
    step = schedule.step
    it = iter(batches * 4)
    losses = [step(it).loss for _ in range(24)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-4:]) < sum(losses[:4]), losses
    assert all(p.dtype == torch.float32 for p in step.model.parameters())


@pytest.mark.parametrize("override,message", [
    ({"model.precision": "fp16"}, "model.precision: 'fp16' is not one of ('fp32', 'bf16')"),
    ({"model.precision": "bf16", "model.name": "sasrec"},
     "model.precision: bf16 is implemented for model.name=hstu only, got sasrec"),
])
def test_bad_precisions_name_the_field(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("smoke", override)


@pytest.mark.parametrize("precisions,message", [
    (["bf16"], "must start with fp32 (the baseline)"),
    (["fp32", "bf16", "bf16"], "name each once"),
    (["fp32", "fp16"], "'fp16' is not one of"),
])
def test_train_ablation_precisions_are_checked(precisions, message):
    with pytest.raises(ConfigError, match=re.escape(f"ablations.train.precisions: ") + ".*" + re.escape(message)):
        load_ablation("train", {"precisions": precisions})
    with pytest.raises(ConfigError, match="leaves out"):
        load_ablation("train", {"precisions": ["fp32", "bf16"], "models": ["sasrec"]})
