"""TANDEM_WEIGHTS=q8: int8 weights times int8 activations on our own kernel; quality."""

from __future__ import annotations

import copy
import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from bench.weights_quality import TEXT, perplexity
from inference.engine import SamplingParams, native_build
from inference.engine.weights import choice, crossover, q8
from inference.engine.weights.choice import build_runner
from inference.engine.weights.projection import Projection
from inference.provisioning import loading
from tests.engine.helpers import (
    WAIT,
    alone_and_together,
    canonical_answer,
    compiled_matches_eager,
    hf_greedy,
    sharpen,
    tiny_config,
)

ALWAYS_Q8 = 1 << 20
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    q8.q8_kernel_missing() is not None, reason=str(q8.q8_kernel_missing())
)


def tiny(dtype: torch.dtype = torch.float32, seed: int = 6) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config()))).to(dtype)


def reference_q8(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in float64: x rounded to int8 per block of 32 (scale = max |x|
    / 127, round half to even), integer products, scaled per block and per output row."""
    rows, width = x.shape
    blocks = x.float().view(rows, width // q8.BLOCK, q8.BLOCK)
    block_scales = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(block_scales > 0, 1 / block_scales, torch.zeros_like(block_scales))
    qx = torch.round(blocks * inverse).double()
    w = q.double().view(q.shape[0], width // q8.BLOCK, q8.BLOCK)
    sums = torch.einsum("rbi,nbi->rnb", qx, w)
    return (sums * block_scales.double().view(rows, 1, -1)).sum(-1) * scales.double()


class ReferenceLinear(nn.Module):
    """An nn.Linear doing q8's arithmetic in Python (`reference_q8`), for HF's own forward."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.q, self.scales = q8.int8_rows(linear.weight.detach())
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        y = reference_q8(rows, self.q, self.scales).to(x.dtype).view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def reference_model(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """A copy whose linears (lm_head included) are `ReferenceLinear`s."""
    reference = copy.deepcopy(model)
    for parent in list(reference.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, ReferenceLinear(child))
    return reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q8_kernel_against_a_reference_matmul(dtype) -> None:
    """The kernel does the arithmetic it says (float32 tolerance against float64), and stays
    within int8 rounding of the float matmul; odd block counts and row counts included."""
    torch.manual_seed(0)
    shapes = ((96, 64), (37, 96), (960, 576))
    for (out_features, in_features), rows in zip(shapes, (1, 5, 33), strict=True):
        weight = torch.randn(out_features, in_features) * 0.05
        weight[3, 7] = 1.5  # an outlier weight sets its row's scale
        x = torch.randn(rows, in_features).to(dtype)
        x[0, :32] = 0  # an all-zero block
        q, scales = q8.int8_rows(weight)
        matrix = q8.Q8Matrix(q, scales)
        y = matrix(x)
        assert y.dtype == dtype and y.shape == (rows, out_features)
        expected = reference_q8(x.float(), q, scales)
        tolerance = 1e-5 if dtype == torch.float32 else 8e-3
        torch.testing.assert_close(y.double(), expected, rtol=tolerance, atol=tolerance)
        exact = x.float() @ weight.t()
        assert ((y.float() - exact).norm() / exact.norm()) < 0.03


def test_q8_weights_are_read_in_tiles_of_interleaved_blocks() -> None:
    """A full tile's rows take turns block by block (the kernel reads each tile as one
    stream); the rows after the last full tile stay as they were; untiling gives q back."""
    tile = q8.native_module().q8_tile
    q = torch.randint(-127, 128, (2 * tile + 3, 3 * q8.BLOCK), dtype=torch.int8)
    tiled = q8.tile_rows(q)
    assert tiled.shape == q.shape and tiled.is_contiguous()
    flat = tiled.view(-1)
    width = q.shape[1]
    for row in range(2 * tile):
        start, r = (row // tile) * tile * width, row % tile
        for block in range(3):
            at = start + (block * tile + r) * q8.BLOCK
            assert torch.equal(
                flat[at : at + q8.BLOCK], q[row, block * q8.BLOCK : (block + 1) * q8.BLOCK]
            )
    assert torch.equal(tiled[2 * tile :], q[2 * tile :])
    assert torch.equal(q8.untile_rows(tiled), q)


def test_q8_rows_do_not_depend_on_their_companions() -> None:
    """Batch invariance in the kernel: a row alone gives the same bits as in 33 rows."""
    torch.manual_seed(1)
    q, scales = q8.int8_rows(torch.randn(200, 576))
    matrix = q8.Q8Matrix(q, scales)
    rows = torch.randn(33, 576)
    together = matrix(rows)
    for index in (0, 7, 32):
        assert torch.equal(matrix(rows[index : index + 1])[0], together[index])


def test_q8_projection_under_a_float32_model_takes_fp16_above_its_crossover() -> None:
    """Up to `max_rows` the q8 kernel, above it fbgemm's fp16 GEMM of the same rounded
    weights; the graphs' opaque op gives the eager call's bits."""
    weight, bias = torch.randn(64, 96) * 0.2, torch.randn(64)
    projection = Projection.from_dense_q8(weight, bias, max_rows=2, large=True)
    kind, matrix = projection.small
    assert kind == "q8" and projection.large is not None
    rounded = matrix.dequantize()
    x = torch.randn(3, 96)
    torch.testing.assert_close(projection(x), x @ rounded.half().float().t() + bias)
    small = projection(x[:2])
    assert torch.equal(small, matrix(x[:2]) + bias)
    direct = torch.ops.tandem.q8_linear(x[:2], matrix.handle, matrix.out_features) + bias
    assert torch.equal(small, direct)
    bf16 = Projection.from_dense_q8(weight.bfloat16(), None, max_rows=2, large=False)
    assert bf16.large is None and bf16.dense.dtype == torch.bfloat16
    own = bf16.small[1].dequantize()
    torch.testing.assert_close(bf16.dense.float(), own, rtol=0.008, atol=1e-6)


def test_a_dropped_q8_matrix_leaves_the_registry() -> None:
    gc.collect()  # earlier tests' matrices leave first
    before = len(q8.OP.matrices)
    matrix = q8.Q8Matrix(*q8.int8_rows(torch.randn(16, 32)))
    assert len(q8.OP.matrices) == before + 1
    del matrix
    gc.collect()
    assert len(q8.OP.matrices) == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_q8_greedy_matches_hf_and_is_batch_invariant(tokenizer, make_engine, dtype) -> None:
    """Every row on the q8 kernel: greedy equals HF's with q8's arithmetic done in Python (in
    float32; bfloat16's other ops round differently in HF), alone or in a batch."""
    model = tiny(dtype)
    runner = build_runner(model, "q8", None, max_rows=ALWAYS_Q8)
    assert runner.weights == "q8"
    engine = make_engine(model, tokenizer, runner=runner, max_running=8, max_step_tokens=64)
    reference = reference_model(model)
    for prompt in ([5, 600, 7000], list(range(300, 340))) if dtype == torch.float32 else ():
        result = engine.generate_batch([(None, prompt, SamplingParams(max_new_tokens=12))], WAIT)
        assert result[0].token_ids == hf_greedy(reference, prompt, 12)
    alone, together = alone_and_together(engine, 7, (3, 11, 29), 6, 3)
    assert together == alone


def test_auto_follows_the_measured_crossover(monkeypatch) -> None:
    """For a float32 model auto is q8 up to the row count measured at start, fp16 above; fp16
    everywhere when q8 wins at no row count (the timing is faked: which kernel wins on this
    machine is what the measurement is for)."""

    timed = []

    def measured(projections, rows=(), before=()):
        """The layers' crossover at 8 rows, the lm_head's (timed after them) at 2."""
        timed.append((projections, list(before)))
        return (8, {1: 0.4, 16: 1.1}) if not before else (2, {1: 0.7, 4: 1.0})

    monkeypatch.setattr(choice, "small_max_rows", measured)
    runner = build_runner(tiny(), "auto", None)
    assert runner.weights == "q8"
    stack = crossover.stack_projections(runner.projections)
    assert timed == [(stack, []), ([runner.head], stack)]  # as a step reads them
    layers = [p for layer in runner.projections for p in vars(layer).values()]
    assert {p.max_rows for p in layers} == {8} and runner.head.max_rows == 2
    assert all(p.small[0] == "q8" and p.large is not None for p in [*layers, runner.head])
    monkeypatch.setattr(
        choice, "small_max_rows", lambda projections, rows=(), before=(): (0, {1: 1.3})
    )
    assert build_runner(tiny(), "auto", None).weights == "fp16"
    assert build_runner(tiny(torch.bfloat16), "auto", None).weights != "q8"


def test_auto_for_a_bfloat16_model_takes_the_faster_of_int8_and_q8(monkeypatch, caplog) -> None:
    """Both kernels are timed at start against the dense bf16 weights; auto keeps the one
    faster at one row (faked timings both ways), int8 at a tie."""
    model = tiny(torch.bfloat16)
    if choice.int8_missing(model) is not None:
        pytest.skip(choice.int8_missing(model))

    def timed(q8_ratio: float, int8_ratio: float):
        def measured(projections, rows=(), before=()):
            ratio = q8_ratio if projections[0].small[0] == "q8" else int8_ratio
            if ratio >= 0.9:
                return 0, {1: ratio}
            return (4, {1: ratio, 8: 1.2}) if not before else (2, {1: ratio})

        return measured

    monkeypatch.setattr(choice, "small_max_rows", timed(0.3, 0.5))
    with caplog.at_level(logging.INFO, logger=choice.__name__):
        runner = build_runner(model, "auto", None)
    assert runner.weights == "q8" and "q8 0.3, int8 0.5" not in caplog.text
    assert "int8 0.5, q8 0.3" in caplog.text
    assert {p.max_rows for layer in runner.projections for p in vars(layer).values()} == {4}
    monkeypatch.setattr(choice, "small_max_rows", timed(0.6, 0.5))
    assert build_runner(model, "auto", None).weights == "int8"
    monkeypatch.setattr(choice, "small_max_rows", timed(0.5, 0.5))
    assert build_runner(model, "auto", None).weights == "int8"
    monkeypatch.setattr(choice, "small_max_rows", timed(0.3, 1.3))
    assert build_runner(model, "auto", None).weights == "q8"


def test_without_a_build_auto_keeps_fp16_and_q8_says_why(monkeypatch, caplog) -> None:
    """A machine without a compiler cannot be made here for real: the build's fault is raised."""

    def no_compiler() -> None:
        raise RuntimeError("Error building extension 'tandem_native'")

    gc.collect()  # earlier tests' matrices leave the C++ registry first
    monkeypatch.setattr(q8, "native_module", no_compiler)
    with caplog.at_level(logging.INFO, logger=choice.__name__):
        assert build_runner(tiny(), "auto", None).weights == "fp16"
        assert build_runner(tiny(), "q8", None).weights == "bf16"
    said = [r for r in caplog.records if "q8" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO, logging.WARNING]
    assert all("Error building extension" in r.getMessage() for r in said)


def test_q8_compiles_through_its_opaque_op(tokenizer, make_engine) -> None:
    """Bucket 1 calls the q8 matrices, bucket 2 fbgemm's (crossover at one row); greedy
    equals the eager run's."""
    model = tiny(seed=8)
    runner = build_runner(model, "q8", None, max_rows=1)
    linears = compiled_matches_eager(model, tokenizer, runner, make_engine)
    assert {m.kind for m in linears} == {"q8"} and all(m.large is not None for m in linears)


CHILD = """
import json, logging, sys, torch
from inference.engine.weights import choice, q4_1, q8
from tests.engine.test_engine_q8 import reference_q8, tiny
from tests.engine.test_engine_q4_1 import random_q4, reference_q4_1
records = []
logging.basicConfig(level=logging.WARNING, handlers=[logging.StreamHandler(sys.stderr)])
torch.manual_seed(2)
q, scales = q8.int8_rows(torch.randn(70, 96))
x = torch.randn(5, 96)
y = q8.Q8Matrix(q, scales)(x)
error = (y.double() - reference_q8(x, q, scales)).abs().max().item()
matrix = random_q4(70, 96, seed=5)
y = q4_1.Q41Matrix(matrix.q, matrix.scales, matrix.mins)(x)
q4_1_error = (y.double() - reference_q4_1(x, matrix)).abs().max().item()
runner = choice.build_runner(tiny(), "q8", None, max_rows=1 << 20)
print(json.dumps({"instructions": q8.q8_instructions(), "error": error,
                  "q4_1_error": q4_1_error, "weights": runner.weights}))
"""


@pytest.mark.timeout(900)  # a build of the module for that capability: ~1 min, more on a busy CI
@pytest.mark.parametrize(("capability", "instructions"), [("avx2", "avx2"), ("default", "scalar")])
def test_each_instruction_path_computes_the_same(capability, instructions) -> None:
    """ATen's capability picks the instructions the module is built for: the AVX2 kernels (the
    path of AVX2-only CPUs) and the plain C++ ones (a CPU without AVX2), q8's and q4_1's, give
    their references' results, and q8 asked for on the plain one warns that it is slow."""
    if capability == "avx2" and not torch.cpu._is_avx2_supported():
        pytest.skip("this CPU has no AVX2")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["instructions"] == instructions
    assert found["error"] < 1e-4 and found["q4_1_error"] < 1e-4 and found["weights"] == "q8"
    slow = "has no vector instructions on this CPU" in done.stderr
    assert slow == (instructions == "scalar")


def test_native_build_follows_the_capability(monkeypatch) -> None:
    """VNNI's flag only on an AVX-512 build of a CPU that has it; none on a plain build."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert native_build.build_flags() == ["-O3", "-fopenmp"]
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert "-mavx2" in native_build.build_flags()
    assert "-mavx512vnni" not in native_build.build_flags()


@pytest.mark.model
@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packaged_q8_quality(dtype) -> None:
    """SmolLM2 with every row of layers and head on q8: perplexity within 1% of the dense
    model's, and the canonical greedy answer."""
    if dtype == "bfloat16" and not torch.cpu._is_avx512_bf16_supported():
        pytest.skip("bfloat16 runs emulated on this CPU; the engine does not use it here")
    loaded = loading.load(None, dtype)
    q8_runner = build_runner(loaded.model, "q8", None, max_rows=ALWAYS_Q8)
    dense = build_runner(loaded.model, "bf16", None)
    ids = loaded.tokenizer(TEXT.read_text())["input_ids"]
    dense_ppl, q8_ppl = perplexity(dense, ids), perplexity(q8_runner, ids)
    assert abs(q8_ppl - dense_ppl) <= 0.01 * dense_ppl, (dense_ppl, q8_ppl)
    assert "Paris" in canonical_answer(loaded, q8_runner)
