"""The step compiled: one AOTInductor graph per row bucket, attention left to the runner.

At one row a decode step is ~120 small matmuls plus norms, rotary and activations, each a
separate eager kernel call; the call overhead and the unpacked bf16 weights, not the bytes,
set its time. Inductor with freezing treats the weights as constants (oneDNN-prepacked
linears, fused elementwise work) and runs the whole layer stack as one generated function.

What cannot be static is attention: it reads a KV cache whose lengths change every step.
So it is an opaque custom op that the graph calls once per layer: `tandem::step_attention`
in C++ where the module is built (step_attention.py), else `tandem::decode_attention` here.
The op runs the step's own `attend` (the runner's: write K/V into the cache, grouped decode
attention, causal attention per prompt chunk), which the caller sets in `StepContext` around
the call; the C++ op runs a view step's attention itself, without the GIL. A step's rows
(decode tokens and prompt chunks together) are padded up to a bucket (1 … 512): shapes are
static, and steps with more rows (long prompts) run eagerly. Each bucket is exported and
compiled ahead of time into a package kept on disk (`compile_cache.py`), so a restart loads
it in under a second; a bucket serves steps as soon as it is loaded or built, the one-row
bucket first, and eager steps stand in for the rest.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.compile_cache import CompileCache, platform_key, tensors_digest
from inference.engine.errors import StepInterrupted
from inference.engine.kv_cache import KVCache
from inference.engine.package_loading import load_graph
from inference.engine.step_attention import ArrivalFlag, ViewStep, step_context, step_op
from inference.engine.timing import fastest_seconds
from inference.engine.weights.projection import Projection, small_kernel

log = logging.getLogger(__name__)

# Up to the engine's default step budget (512 tokens), so prompt chunks run compiled too.
# 48: a full engine's 31-32 decoders plus a paced prompt chunk. Next to them the smallest
# mixed step was the 64-row graph, 58-99 ms against their 42-45 ms decode step while a
# 2,000-token prompt prefilled (2-core AMD EPYC, 2026-12-02): the pacer could not keep it
# within its multiple, and the decoders' ITL p99 went to 2.7x their p50 before. 40: late in a
# long prompt its chunk is the pacer's floor (8 tokens) beside 31 decoders, 39 rows, which the
# 48-row graph padded by 9 (80-97 ms steps against a 40-45 ms decode step).
BUCKETS = (1, 2, 4, 8, 16, 32, 40, 48, 64, 128, 256, 512)
# Rows a graph computes logits for (at most; the rest are padding): every decoder of a full
# engine (max_running 32) plus nothing else; a step that samples more runs eagerly.
LOGIT_ROWS = 32
WARM_TIMINGS = 3


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step's rows as the model sees them, the rows that get logits, and its attention.

    `attend(q, kv, layer)` writes the rows' K/V (`kv` [rows, 2 * kv_heads * head_dim]: keys,
    then values) into the cache and returns their attention output; the eager pass and the
    compiled graph call the same one.
    """

    token_ids: list[int]
    positions: list[int]
    logit_rows: list[int]
    attend: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    device: torch.device
    interrupt: Callable[[int], bool] | None = None
    # The engine's arrival flag (set: a newcomer may cut in before a layer), and for a view
    # step what the C++ op needs to attend without calling `attend` (step_attention.py).
    arrivals: ArrivalFlag | None = None
    view: ViewStep | None = None


@dataclass(slots=True)
class StepContext:
    """What the attention op needs for one compiled step (set only around the graph call)."""

    attend: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    rows: int
    interrupt: Callable[[int], bool] | None
    # What the op raised: a compiled graph hands it back as a RuntimeError with its text,
    # so `run_stack` raises this one instead (StepInterrupted keeps its type and layer).
    raised: BaseException | None = field(default=None)


_step = threading.local()


# Defined and implemented apart, as `tandem::fp16_linear` is: `torch.library.custom_op`'s
# wrapper (an aliasing check among others) cost ~10 µs a call, a plain Python kernel ~5.
# Packings the graphs reach through an opaque op by handle; inductor's GEMM templates take the
# others (int4, int8) as tensors.
HANDLE_KINDS = ("fp16", "q8", "q4_1")
TEMPLATE_KINDS = ("int4", "int8")
torch.library.define("tandem::decode_attention", "(Tensor q, Tensor kv, int layer) -> Tensor")


def _decode_attention(q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
    """Write the real rows' K/V into the cache and attend; padded rows come back as zeros.

    First a newcomer's step may run (the step's `interrupt`), and the step goes on from this
    layer, or starts over (StepInterrupted) if that step moved the cache's rows."""
    context: StepContext = _step.context
    try:
        if context.interrupt is not None and context.interrupt(layer):
            raise StepInterrupted(layer)
        rows = context.rows
        out = context.attend(q[:rows], kv[:rows], layer)
    except BaseException as exc:
        context.raised = exc
        raise
    if rows == q.shape[0]:
        return out
    return torch.cat([out, out.new_zeros(q.shape[0] - rows, out.shape[1])])


# The Python op, and the C++ op's way back to Python (step_attention.cpp).
torch.library.impl("tandem::decode_attention", "CompositeExplicitAutograd")(_decode_attention)


@torch.library.register_fake("tandem::decode_attention")
def _decode_attention_shape(q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
    return q.new_empty(q.shape)


class _Linear(nn.Module):
    """A projection with its weights registered, so freezing folds them into the graph.

    The kernel is fixed when the graph is traced (the bucket's row count is static): the
    weight-only one for buckets up to `compiled_max_rows` (the projection's eager `max_rows`
    unless CompiledDecode raises it for inductor's templates), the dense packing (or the
    projection's `large` kernel) above; eager calls switch at `max_rows`, the crossover
    measured at start. fbgemm's fp16, q8's and q4_1's matrices are called through their opaque
    ops by handle (`weights/handles.py`), so no package holds them.
    """

    def __init__(self, projection: Projection) -> None:
        super().__init__()
        self.max_rows = projection.max_rows
        self.compiled_max_rows = projection.max_rows
        self.weight = nn.Parameter(projection.dense, requires_grad=False)
        self.bias = None if projection.bias is None else nn.Parameter(projection.bias, False)
        self.kind = projection.small[0] if projection.small is not None else "dense"
        self.large = projection.large
        self.by_handle = None
        if self.kind in HANDLE_KINDS:
            self.by_handle = projection.small[1]
        elif projection.small is not None:
            packed, scales = projection.small[1]
            self.register_buffer("packed", packed, persistent=False)
            self.register_buffer("scales", scales, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        limit = self.compiled_max_rows if torch.compiler.is_compiling() else self.max_rows
        if x.shape[0] <= limit:
            packing = self.by_handle if self.by_handle is not None else (self.packed, self.scales)
            return small_kernel(x, self.kind, packing, self.bias)
        if self.large is not None:
            return small_kernel(x, "fp16", self.large, self.bias)
        return nn.functional.linear(x, self.weight, self.bias)


class DecodeModel(nn.Module):
    """The decoder stack: ids and positions in, float32 logits of the picked rows out.

    The runner's one forward: it runs as it is for eager steps and, compiled per bucket,
    for the steps that fit a graph.
    """

    def __init__(self, runner: object) -> None:
        super().__init__()
        model = runner.model
        self.inner = model.model
        self.lm_head = model.lm_head if runner.head is None else _Linear(runner.head)
        self.linears = nn.ModuleList(
            nn.ModuleDict(
                {
                    "qkv": _Linear(p.qkv),
                    "o": _Linear(p.o),
                    "gate_up": _Linear(p.gate_up),
                    "down": _Linear(p.down),
                }
            )
            for p in runner.projections
        )
        self.qkv_sizes = list(runner.qkv_sizes)
        self.num_heads = runner.num_heads
        self.num_kv_heads = runner.num_kv_heads
        self.head_dim = runner.head_dim

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, pick: torch.Tensor
    ) -> torch.Tensor:
        inner = self.inner
        hidden = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(hidden, positions[None])
        cos, sin = cos[0], sin[0]
        rows = ids.shape[0]
        # The C++ op once the module is loaded (a graph is traced after the runner loads it).
        attention = step_op() or torch.ops.tandem.decode_attention
        for index, (layer, lin) in enumerate(zip(inner.layers, self.linears, strict=True)):
            x = layer.input_layernorm(hidden)
            q, k, v = lin["qkv"](x).split(self.qkv_sizes, dim=-1)
            q = q.view(rows, self.num_heads, self.head_dim)
            k = k.view(rows, self.num_kv_heads, self.head_dim)
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
            kv = torch.cat([k.reshape(rows, -1), v], dim=-1)
            attended = attention(q.reshape(rows, -1), kv, index)
            hidden = hidden + lin["o"](attended)
            gate, up = lin["gate_up"](layer.post_attention_layernorm(hidden)).chunk(2, dim=-1)
            hidden = hidden + lin["down"](layer.mlp.act_fn(gate) * up)
        return self.lm_head(inner.norm(hidden[pick])).float()


def gemm_templates(device: torch.device) -> bool:
    """Whether the graphs multiply by the weight-only packing (int8, int4) at every bucket,
    on inductor's C++ GEMM template: on a CPU with AMX tiles, where its micro-kernel
    dequantizes a tile in registers and multiplies it on AMX. ATen's weight-only kernels
    lose to the dense bf16 GEMM from a few rows on; the template wins at every bucket
    (2-core Xeon with AMX, whole int8 step, 31 decoders at history 64 plus a prompt chunk:
    1 row 17.9 ms against 25.1 on ATen's kernels, 32 rows 33.5 against 47.3 on dense bf16,
    64 rows 56.8 against 90.8, 512 rows 251 against 312). Elsewhere the eager crossover
    stands (`template_rows`)."""
    return device.type == "cpu" and torch.cpu._is_amx_tile_supported()


def template_rows(device: torch.device, weight_only_rows: int, largest: int) -> int:
    """Up to how many rows the graphs time inductor's C++ GEMM template against ATen's
    kernel, shape by shape, and keep the faster (max_autotune): every bucket on AMX; on
    another AVX-512 CPU the buckets on the weight-only kernel (up to the eager crossover),
    where the template's AVX-512 micro-kernel (dequantizing in registers) beat ATen's int8
    kernel at one and two rows, its whole one-row step 13-16 ms against 23-25 (2-core AMD
    EPYC Zen 4, 2026-12-03). Above the crossover it lost badly on that CPU (32 rows 360 ms
    against ~55 on dense bf16), so those buckets keep the dense GEMM, untimed. 0: never (no
    AVX-512, where the template was not measured, or dense weights only)."""
    if gemm_templates(device):
        return largest
    if device.type != "cpu" or not torch.cpu._is_avx512_supported():
        return 0
    return weight_only_rows


def run_stack(
    stack: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    step: StepPlan,
    rows: int,
    picks: int,
) -> torch.Tensor:
    """Logits [len(step.logit_rows), vocab] of `step` through `stack` (eager or a graph).

    Ids and positions are padded with zeros to `rows`, the picked rows to `picks`; the
    step's `attend` is what the attention op runs meanwhile.
    """
    device = step.device
    ids = torch.zeros(rows, dtype=torch.long, device=device)
    positions = torch.zeros(rows, dtype=torch.long, device=device)
    pick = torch.zeros(picks, dtype=torch.long, device=device)
    real = len(step.token_ids)
    ids[:real] = torch.tensor(step.token_ids, device=device)
    positions[:real] = torch.tensor(step.positions, device=device)
    pick[: len(step.logit_rows)] = torch.tensor(step.logit_rows, dtype=torch.long, device=device)
    outer = getattr(_step, "context", None)  # a step a newcomer's runs inside
    context = StepContext(step.attend, real, step.interrupt)
    _step.context = context
    # Without the flag a step that may be cut into keeps every layer on `attend`.
    arrivals = step.arrivals if step.interrupt is not None else None
    view = step.view if step.interrupt is None or arrivals is not None else None
    try:
        with step_context(real, _decode_attention, arrivals, view):
            logits = stack(ids, positions, pick)
    except Exception:
        if context.raised is not None:
            raise context.raised from None
        raise
    finally:
        _step.context = outer
    return logits[: len(step.logit_rows)]


# A larger bucket takes a smaller one's steps when its timed step is this much cheaper.
ROUTE_MARGIN = 0.95


@dataclass(slots=True)
class BucketState:
    """Where one bucket stands (`/health`): pending, warming, loaded (from the cache) or built
    (here, and stored), and the seconds that took."""

    state: str = "pending"
    seconds: float | None = None


class CompiledDecode:
    """Compiled decode graphs by bucket; `run` pads a step to the smallest ready bucket."""

    def __init__(
        self, runner: object, buckets: tuple[int, ...] = BUCKETS, cache_dir: Path | None = None
    ) -> None:
        """`cache_dir` holds the packages (compile_cache.py); None: a folder of this process
        that nothing else reads. Build it on the thread that warms it: inductor's config is
        per thread."""
        self.templates = gemm_templates(runner.kv_spec.device)
        for module in runner.stack.modules():
            if self.templates and isinstance(module, _Linear) and module.kind in TEMPLATE_KINDS:
                module.compiled_max_rows = buckets[-1]
        weight_only = [
            m.compiled_max_rows
            for m in runner.stack.modules()
            if isinstance(m, _Linear) and m.kind in TEMPLATE_KINDS
        ]
        self.template_rows = template_rows(
            runner.kv_spec.device, max(weight_only, default=0), max(buckets)
        )
        self.runner = runner
        self.buckets = buckets
        self.cache = CompileCache(cache_dir) if cache_dir is not None else None
        self.graphs: dict[int, Callable[..., torch.Tensor]] = {}
        self.states = {size: BucketState() for size in buckets}
        self.warm_seconds: dict[int, float] = {}
        self.step_seconds: dict[int, float] = {}
        self.alone_seconds: dict[int, float] = {}
        self.key_seconds: float | None = None
        self.ready = False  # every bucket warmed and timed

    @property
    def max_rows(self) -> int:
        """Steps with more rows than this run eagerly."""
        return self.buckets[-1]

    def bucket(self, rows: int) -> int | None:
        """The ready bucket a step of `rows` runs in (None: none is ready yet): the smallest
        holding it, or once every bucket is timed, the one whose step took least of those
        holding it by a margin (`ROUTE_MARGIN`: the warm-up's timings are a few runs each).

        A bucket on the weight-only kernel can cost more than the next one up on the dense
        GEMM: the crossover is timed against ATen's kernel, where the graphs run inductor's
        AMX template. On a Xeon with AMX the 8-row bucket (q8) read 19.5-20.3 ms against
        15.7-17.4 for the 16-row one (dense bfloat16), and 8 streams ran at 322 tok/s
        against 380 when the crossover was 4 rows."""
        holding = [b for b in self.buckets if b >= rows and b in self.graphs]
        if not holding:
            return None
        chosen = holding[0]
        if self.ready:
            for size in holding[1:]:
                if self.step_seconds[size] < ROUTE_MARGIN * self.step_seconds[chosen]:
                    chosen = size
        return chosen

    def fits(self, rows: int, logit_rows: int) -> bool:
        """Whether a step of `rows` rows, `logit_rows` of them sampled, has a graph."""
        size = self.bucket(rows) if rows > 0 else None
        return size is not None and logit_rows <= min(size, LOGIT_ROWS)

    def run(self, step: StepPlan) -> torch.Tensor:
        """Logits of a step through its bucket's graph: rows padded to the bucket (token 0
        at position 0: attend never sees them), a fixed number of picked rows."""
        size = self.bucket(len(step.token_ids))
        return run_stack(self.graphs[size], step, size, min(size, LOGIT_ROWS))

    def status(self) -> dict[int, dict[str, object]]:
        """Each bucket's state and seconds (`/health`, `/ops/`)."""
        return {size: {"state": s.state, "seconds": s.seconds} for size, s in self.states.items()}

    def key(self, weights: str) -> dict[str, object]:
        """What makes the packages valid (compile_cache.py); each is the bucket's of it."""
        linears = sorted(
            {
                (m.kind, m.max_rows, m.compiled_max_rows)
                for m in self.runner.stack.modules()
                if isinstance(m, _Linear)
            }
        )
        return {
            **platform_key(),
            "weights": weights,
            "weights_kind": self.runner.weights,
            "dtype": str(self.runner.kv_spec.dtype),
            "device": str(self.runner.kv_spec.device),
            "linears": [list(entry) for entry in linears],
            "templates": self.templates,
            "template_rows": self.template_rows,
        }

    def _build(self, size: int, path: Path) -> None:
        """Export the stack at `size` rows and compile it into the package `path`: frozen
        weights, and up to `template_rows` each matmul shape timed on inductor's C++ GEMM
        template against ATen's kernel (~3 s a shape), the faster kept."""
        args = (
            torch.zeros(size, dtype=torch.long, device=self.runner.kv_spec.device),
            torch.zeros(size, dtype=torch.long, device=self.runner.kv_spec.device),
            torch.zeros(min(size, LOGIT_ROWS), dtype=torch.long, device=self.runner.kv_spec.device),
        )
        program = torch.export.export(self.runner.stack, args, strict=False)
        torch._inductor.aoti_compile_and_package(
            program,
            package_path=str(path),
            inductor_configs={
                "freezing": True,
                "max_autotune": size <= self.template_rows,
                "max_autotune_gemm_backends": "CPP,ATEN",
            },
        )

    def _graph(self, size: int, weights: str, scratch: Path) -> Callable[..., torch.Tensor]:
        """The bucket's graph, from the cache or built (into it, or into `scratch`)."""
        if self.cache is None:
            path = scratch / f"bucket-{size}.pt2"
            self._build(size, path)
            self.states[size].state = "built"
            return load_graph(path)
        loaded = self.cache.get(self.key(weights), size, partial(self._build, size))
        self.states[size].state = loaded.how
        if loaded.how == "built":
            log.info("compiled step: bucket %d had %s", size, loaded.note or "no cache entry")
        return loaded.graph

    def warm(self, plan: Callable[[StepBatch, KVCache], StepPlan]) -> None:
        """Load or build every bucket, smallest first, each serving steps once it is there;
        then time it on a scratch cache of its own: one step of the graph (`step_seconds`,
        which seed the prefill pacer: the fastest of WARM_TIMINGS runs, as the first runs
        still fault in its constants, 2-3x a steady step).

        A bucket up to LOGIT_ROWS is timed with that many decode rows; a larger one with
        LOGIT_ROWS decode rows and a prompt chunk filling the rest, then once more as one
        prompt's chunk alone (`alone_seconds`: what a prefill-only step of its rows costs;
        for the smaller buckets the pacer takes the decode step's time). The decode attention
        kernel `plan` calls is ready before. Last, the runner's probe times a prompt chunk's
        attention per key it attends (`key_seconds`): the floor of the pacer's per-key cost.
        """
        weights = tensors_digest(
            [*self.runner.stack.named_parameters(), *self.runner.stack.named_buffers()]
        )
        cache = KVCache(self.runner.kv_spec, LOGIT_ROWS + 1, self.max_rows)
        with tempfile.TemporaryDirectory(prefix="tandem-buckets-") as scratch:
            for size in self.buckets:
                started = time.perf_counter()
                self.states[size].state = "warming"
                self.graphs[size] = self._graph(size, weights, Path(scratch))
                step = self._timing_step(plan, cache, size)
                self.run(step)
                self.warm_seconds[size] = round(time.perf_counter() - started, 1)
                self.states[size].seconds = self.warm_seconds[size]
                self.step_seconds[size] = fastest_seconds(partial(self.run, step), WARM_TIMINGS)
                cache.reset()
                if size > LOGIT_ROWS:
                    self.alone_seconds[size] = self._prefill_seconds(plan, cache, size)
                log.info(
                    "compiled step: bucket %d %s in %.1f s%s",
                    size,
                    "loaded from the cache" if self.states[size].state == "loaded" else "built",
                    self.warm_seconds[size],
                    " (matmuls timed on the C++ template)"
                    if self.states[size].state == "built" and size <= self.template_rows
                    else "",
                )
        self.key_seconds = self.runner.chunk_key_seconds()
        self.ready = True

    @staticmethod
    def _timing_step(
        plan: Callable[[StepBatch, KVCache], StepPlan], cache: KVCache, size: int
    ) -> StepPlan:
        """A step of `size` rows on the scratch cache: up to LOGIT_ROWS decoders, then one
        prompt chunk for the rest."""
        decoders = min(size, LOGIT_ROWS)
        slots = [cache.allocate() for _ in range(decoders)]
        for slot in slots:
            cache.extend(slot, 1)
        chunks = []
        if size > decoders:
            slot = cache.allocate()
            cache.extend(slot, size - decoders)
            chunks.append(PrefillChunk(slot, 0, [0] * (size - decoders), needs_logits=False))
        batch = StepBatch(
            decode_slots=slots,
            decode_token_ids=[0] * decoders,
            decode_positions=[0] * decoders,
            chunks=chunks,
        )
        return plan(batch, cache)

    def _prefill_seconds(
        self, plan: Callable[[StepBatch, KVCache], StepPlan], cache: KVCache, size: int
    ) -> float:
        """One prompt's `size`-token chunk alone through the bucket's graph (fastest of
        WARM_TIMINGS). The pacer gives a short prompt a step of its own while others decode
        only if that step costs little enough; seeded with the mixed step's time instead
        (31 decoders beside the chunk: their attention and their rows' logits), a 40-token
        prompt's 48-row step looked too dear at a multiple of 1.4 and went in mixed steps,
        3.3x its idle time to first token (2-core AMD EPYC, 2026-12-03)."""
        slot = cache.allocate()
        cache.extend(slot, size)
        chunk = PrefillChunk(slot, 0, [0] * size, needs_logits=True)
        step = plan(StepBatch(chunks=[chunk]), cache)
        seconds = fastest_seconds(partial(self.run, step), WARM_TIMINGS)
        cache.reset()
        return seconds
