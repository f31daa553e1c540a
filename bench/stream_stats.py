"""The streaming bench's figures: one row per case, a Markdown table and the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
from collections import Counter
from dataclasses import dataclass, field

import psutil

from bench.stats import percentile
from bench.stream_clients import Client

MIB = 1024 * 1024


@dataclass
class Row:
    """One case: a transport, a client count, a token source."""

    source: str
    transport: str
    clients: int
    conversations: int
    replies: int
    servers: int
    held: int
    errors: int
    gaps: int
    dups: int
    offered_tok_s: float | None
    delivered_tok_s: float
    saved_equal: bool
    connect_p99_s: float
    deliveries: int
    deliveries_per_s: float
    pieces_per_s: float
    delay_p50_ms: float | None
    delay_p99_ms: float | None
    delay_max_ms: float | None
    rss_before_mib: float
    rss_held_mib: float
    kib_per_connection: float | None
    threads_held: int
    server_cpu: float
    cpu_ms_per_delivery: float | None
    bench_cpu: float
    load_before: float
    load_after: float
    error_kinds: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)


def delivered(clients: list[Client], window: tuple[float, float]) -> float:
    """Pieces per second that reached readers, each reply counted once (its best reader): the
    pieces of the deltas emitted inside the window."""
    start, end = window
    best: dict[int, int] = {}
    for client in clients:
        pieces = sum(n for emitted, _, n in client.deltas if start <= emitted < end)
        best[client.message_id] = max(best.get(client.message_id, 0), pieces)
    return round(sum(best.values()) / (end - start), 1)


def saved_equal(clients: list[Client], saved: dict[int, str]) -> bool:
    """Every reader's text of every part it saw equals the part's saved text."""
    return bool(saved) and all(
        text == saved.get(part_id) for client in clients for part_id, text in client.texts.items()
    )


def summarize(
    clients: list[Client],
    window: tuple[float, float],
    rss: tuple[int, int],
    saved: dict[int, str],
    **facts,
) -> Row:
    """Delays of the deltas the engine emitted inside the window, errors, memory per socket.

    `pieces_per_s` is what one reader of a reply got per second (the median reader): below
    the synthetic rate, the engine or the writer thread fell behind the pace. `delivered_tok_s`
    is the pieces all replies delivered per second (against `offered_tok_s`, replies × rate),
    `saved_equal` whether the saved text is the streamed text for every reply (`saved`: part
    id → the text in the database after the end).
    `cpu_ms_per_delivery` is the Daphnes' CPU time in the window over the deltas delivered in
    it (the engine and writer included).
    """
    start, end = window
    delays = [
        (received - emitted) * 1000
        for client in clients
        for emitted, received, _ in client.deltas
        if start <= emitted < end
    ]
    held = sum(c.connected and c.error is None for c in clients)
    failed = [c for c in clients if c.error is not None or c.gaps or c.duplicates or not c.finished]
    kinds = Counter(
        (c.error or "").split(":")[0]
        or ("sequence gap" if c.gaps else "repeated piece" if c.duplicates else "no end seen")
        for c in failed
    )
    connects = [c.connect_seconds for c in clients if c.connected]
    per_reader = [sum(start <= emitted < end for emitted, _, _ in c.deltas) for c in clients]
    before, after = rss
    connected = sum(c.connected for c in clients)
    server_cpu = facts["server_cpu"]
    return Row(
        clients=len(clients),
        held=held,
        errors=len(failed),
        gaps=sum(c.gaps for c in clients),
        dups=sum(c.duplicates for c in clients),
        replies=len({c.message_id for c in clients}),
        delivered_tok_s=delivered(clients, window),
        saved_equal=saved_equal(clients, saved),
        cpu_ms_per_delivery=(
            round(server_cpu * (end - start) * 1000 / len(delays), 3) if delays else None
        ),
        connect_p99_s=round(percentile(connects, 99), 3) if connects else 0.0,
        deliveries=len(delays),
        deliveries_per_s=round(len(delays) / (end - start), 1),
        pieces_per_s=round(statistics.median(per_reader) / (end - start), 1),
        delay_p50_ms=round(percentile(delays, 50), 2) if delays else None,
        delay_p99_ms=round(percentile(delays, 99), 2) if delays else None,
        delay_max_ms=round(max(delays), 2) if delays else None,
        rss_before_mib=round(before / MIB, 1),
        rss_held_mib=round(after / MIB, 1),
        kib_per_connection=round((after - before) / 1024 / connected, 1) if connected else None,
        error_kinds=dict(kinds),
        error_samples=sorted({c.error for c in failed if c.error})[:3],
        **facts,
    )


COLUMNS = [
    ("source", "source"),
    ("transport", "path"),
    ("clients", "clients"),
    ("conversations", "convs"),
    ("servers", "daphnes"),
    ("held", "held"),
    ("errors", "errors"),
    ("gaps", "gaps"),
    ("dups", "dups"),
    ("replies", "replies"),
    ("offered_tok_s", "offered tok/s"),
    ("delivered_tok_s", "delivered tok/s"),
    ("saved_equal", "saved=streamed"),
    ("pieces_per_s", "pieces/s/reply"),
    ("deliveries_per_s", "msgs/s"),
    ("delay_p50_ms", "delay p50 ms"),
    ("delay_p99_ms", "delay p99 ms"),
    ("delay_max_ms", "max ms"),
    ("kib_per_connection", "KiB/conn"),
    ("threads_held", "threads"),
    ("server_cpu", "daphne CPU"),
    ("cpu_ms_per_delivery", "CPU ms/msg"),
    ("bench_cpu", "bench CPU"),
    ("load_before", "load before"),
    ("load_after", "load after"),
]


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (CPU in cores busy during the window)."""
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        cells = [
            "–" if getattr(row, name) is None else str(getattr(row, name)) for name, _ in COLUMNS
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> dict[str, object]:
    """What the figures were measured on (the CPU model only /proc/cpuinfo tells)."""
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / MIB / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
