"""docs/benchmarks.md's figures, made from the runs kept in bench/results/kept/.

    .venv/bin/python -m bench.results_page            # rewrites the page's generated block
    .venv/bin/python -m bench.results_page --check    # exits 1 if the page says otherwise

A kept run is the JSON `bench.engine` writes (`--keep` adds the fields below and writes it
here), or a subset of it with the same key names. Besides `peers` it needs `date` (ISO, UTC),
`commit`, `source`, `cpu` (`name`, `vendor`, `family`, `model` and `flags`: avx2, avx512f,
avx512_bf16, amx), `load` (the 1-minute load average when the figures `start`ed and at the
`end`), `machine.cores`, `machine.weights` and `model.dtype`. The page shows, for each kind
of CPU, its newest kept run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / "bench" / "results" / "kept"
PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- results:begin: made by `make bench-docs` from bench/results/kept/, do not edit -->"
END = "<!-- results:end -->"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx")
# (slug, title, vendor, family, avx512f, avx512_bf16, amx) in the page's order; the first match
# wins. Zen 5 (family 26) has Zen 4's flags but a full-width AVX-512 datapath: a kind of its own.
KINDS = (
    ("intel-amx", "Intel Xeon with AMX", "Intel", None, True, True, True),
    ("amd-zen5", "AMD EPYC with AVX-512 BF16 (Zen 5)", "AMD", 26, True, True, False),
    ("amd-avx512-bf16", "AMD EPYC with AVX-512 BF16 (Zen 4)", "AMD", 25, True, True, False),
    ("intel-avx512", "Intel Xeon with AVX-512, no AMX", "Intel", None, True, None, False),
    ("amd-avx2", "AMD EPYC with AVX2 only (Zen 2/3)", "AMD", None, False, False, False),
)
# (system, label) of the tokens/s rows, and (ratio key's head, label) of the ratio rows.
SYSTEMS = (
    ("tandem", "Tandem in process"),
    ("hf_static", "HF `generate`, static batch"),
    ("tandem-http", "Tandem over HTTP"),
    ("llama.cpp-http", "llama.cpp `llama-server` over HTTP"),
    ("vllm-cpu", "vLLM CPU, offline"),
)
RATIOS = (
    ("tandem/hf_static", "Tandem / HF static"),
    ("tandem-http/llama.cpp-http", "Tandem / llama.cpp, both over HTTP"),
    ("tandem/vllm-cpu", "Tandem / vLLM CPU"),
)


class MalformedResult(ValueError):
    """A kept file that lacks what the page needs."""


def kind(cpu: dict) -> tuple[str, str]:
    """The (slug, title) of a CPU's kind, from its vendor, family and ISA flags."""
    flags = cpu["flags"]
    for slug, title, vendor, family, avx512f, bf16, amx in KINDS:
        wanted = {"avx512f": avx512f, "avx512_bf16": bf16, "amx": amx}
        if (
            vendor == cpu["vendor"]
            and family in (None, cpu["family"])
            and all(value is None or flags[flag] == value for flag, value in wanted.items())
        ):
            return slug, title
    isa = " ".join(flag for flag in FLAGS if flags[flag]) or "no AVX2"
    return f"{cpu['vendor'].lower()}-{isa.replace(' ', '-')}", f"{cpu['vendor']} ({isa})"


NUMBER = (int, float)
# What the page reads, by path, and the JSON types it must have.
REQUIRED = (
    (("date", "commit", "source", "cpu.name", "cpu.vendor", "model.dtype"), (str,)),
    (("machine.weights",), (str,)),
    (("cpu.family", "cpu.model", "machine.cores"), (int,)),
    (("load.start", "load.end"), NUMBER),
    (tuple(f"cpu.flags.{flag}" for flag in FLAGS), (bool,)),
    (("peers",), (list,)),
)
ROW = (("system", (str,)), ("streams", (int,)), ("arrivals", (str,)), ("tokens_per_s", NUMBER))


def _check(value: object, types: tuple[type, ...], where: str) -> None:
    """Raise unless `value` is one of `types` (a bool is not a number here)."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise MalformedResult(f"{where} is {value!r}")


def _get(record: dict, path: str, where: str) -> object:
    value: object = record
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise MalformedResult(f"{where}: no {path}")
        value = value[key]
    return value


def read(path: Path) -> dict:
    """One kept run, checked for what the page reads."""
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise MalformedResult(f"{path.name}: {exc}") from exc
    if not isinstance(record, dict):
        raise MalformedResult(f"{path.name}: not an object")
    for paths, types in REQUIRED:
        for key in paths:
            _check(_get(record, key, path.name), types, f"{path.name}: {key}")
    try:
        datetime.fromisoformat(record["date"].replace("Z", "+00:00"))
    except ValueError as exc:
        raise MalformedResult(f"{path.name}: date {record['date']!r}") from exc
    if not record["peers"]:
        raise MalformedResult(f"{path.name}: no peers")
    for i, row in enumerate(record["peers"]):
        for key, types in ROW:
            where = f"{path.name}: peers[{i}]"
            _check(_get(row, key, where), types, f"{where}.{key}")
    return record


def newest_by_kind(folder: Path = KEPT) -> dict[str, dict]:
    """Each kind's newest kept run, in the page's order of kinds."""
    newest: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")):
        record = read(path)
        slug, _ = kind(record["cpu"])
        if slug not in newest or record["date"] > newest[slug]["date"]:
            newest[slug] = record
    order = [k[0] for k in KINDS]
    return dict(sorted(newest.items(), key=lambda kv: (order + [kv[0]]).index(kv[0])))


def _num(value: float, digits: int = 1) -> str:
    """A figure as the runs print it; a whole number as it was written down."""
    return f"{value:,}" if isinstance(value, int) else f"{value:,.{digits}f}"


def _short(value: float) -> str:
    """A ratio as the page gives it: at most 3 decimals, no trailing zeros."""
    return f"{round(value, 3):g}"


def _when(record: dict) -> str:
    moment = datetime.fromisoformat(record["date"].replace("Z", "+00:00")).astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _tok_s(record: dict, system: str, streams: int) -> float | None:
    return next(
        (
            row["tokens_per_s"]
            for row in record["peers"]
            if (row["system"], row["streams"], row["arrivals"]) == (system, streams, "burst")
        ),
        None,
    )


def _stall(hol: dict) -> float | None:
    if {"itl_during_p99_ms", "itl_before_p50_ms"} <= hol.keys():
        return hol["itl_during_p99_ms"] / hol["itl_before_p50_ms"]
    return None


def summary(records: dict[str, dict]) -> str:
    """One line per kind: the engine's tokens/s at each level, over HTTP, the stall."""
    lines = [
        "| CPU kind | Tandem tok/s, 1 / 8 / 32 streams | over HTTP, 1 / 32 | stall | run |",
        "|---|---:|---:|---:|---|",
    ]
    for slug, record in records.items():
        _, title = kind(record["cpu"])

        def cells(system: str, levels: tuple[int, ...], rec: dict = record) -> str:
            values = [_tok_s(rec, system, n) for n in levels]
            return " / ".join("–" if v is None else _num(v) for v in values)

        stall = _stall(record.get("head_of_line") or {})
        lines.append(
            f"| [{title}](#{slug}) | {cells('tandem', (1, 8, 32))} | "
            f"{cells('tandem-http', (1, 32))} | "
            f"{'–' if stall is None else _num(stall, 2) + '×'} | "
            f"{_when(record)[:10]}, {record['commit']}{' (see its note)' * ('note' in record)} |"
        )
    return "\n".join(lines)


def table(slug: str, record: dict) -> str:
    """One kind's section: the machine and run, tokens/s and ratios, the engine's own bars."""
    _, title = kind(record["cpu"])
    cpu, load = record["cpu"], record["load"]
    flags = " ".join(flag for flag in FLAGS if cpu["flags"][flag]) or "none of " + ", ".join(FLAGS)
    levels = sorted({row["streams"] for row in record["peers"]})
    lines = [
        f'<a id="{slug}"></a>',
        f"### {title}",
        "",
        f"{_when(record)}, commit {record['commit']}: {record['machine']['cores']} cores of "
        f"{cpu['name']} (family {cpu['family']} model {cpu['model']}; {flags}), the model in "
        f"{record['model']['dtype']}, weights {record['machine']['weights']}; 1-minute load "
        f"{load['start']:.2f} when the figures started, {load['end']:.2f} at the end.",
        "",
        "| tok/s | " + " | ".join(f"{n} stream{'s' * (n > 1)}" for n in levels) + " |",
        "|---|" + "---:|" * len(levels),
    ]
    for system, label in SYSTEMS:
        values = [_tok_s(record, system, n) for n in levels]
        if any(v is not None for v in values):
            cells = " | ".join("–" if v is None else _num(v) for v in values)
            lines.append(f"| {label} | {cells} |")
    ratios = record.get("ratios", {})
    for head, label in RATIOS:
        values = [ratios.get(f"{head}@{n}/burst") for n in levels]
        if any(v is not None for v in values):
            cells = " | ".join("–" if v is None else f"{v:.2f}×" for v in values)
            lines.append(f"| {label} | {cells} |")
    lines.append("")
    lines.append(_bars(record))
    if "note" in record:
        lines += ["", record["note"]]
    lines += ["", f"*Source: {record['source']}.*", ""]
    return "\n".join(lines)


def _bars(record: dict) -> str:
    """The head-of-line and flatness figures in one paragraph."""
    hol, parts = record.get("head_of_line") or {}, []
    stall = _stall(hol)
    if stall is not None:
        parts.append(
            f"31 decoders' ITL p99 during a {hol.get('long_prompt_tokens', 2000):,}-token prompt "
            f"{_num(hol['itl_during_p99_ms'])} ms against a p50 of "
            f"{_num(hol['itl_before_p50_ms'])} before: stall **{_num(stall, 2)}×** (bar ≤ 2)"
        )
    if {"loaded_ttft_ms", "idle_ttft_ms", "loaded_over_idle"} <= hol.keys():
        parts.append(
            f"TTFT {_num(hol['loaded_ttft_ms'])} ms among them against "
            f"{_num(hol['idle_ttft_ms'])} idle ({_short(hol['loaded_over_idle'])}×, bar ≤ 1.5)"
        )
    if "long_prompt_ttft_ms" in hol:
        parts.append(f"the long prompt's TTFT {hol['long_prompt_ttft_ms'] / 1000:.1f} s")
    long = record.get("prefill") or {}
    if long.get("tandem_http_ttft_ms") and long.get("llama.cpp_http_ttft_ms"):
        tandem, llama = long["tandem_http_ttft_ms"], long["llama.cpp_http_ttft_ms"]
        parts.append(
            f"a {long.get('tandem_http_prompt_tokens', 2000):,}-token prompt alone over HTTP: "
            f"TTFT {_num(tandem)} ms against llama.cpp's {_num(llama)} "
            f"(**{_num(tandem / llama, 2)}×**, bar ≤ 1)"
        )
    flat = record.get("itl_last_over_first_quarter")
    if flat is not None:
        parts.append(
            f"one stream's ITL last / first quarter over 512 tokens {_short(flat)} (≤ 1.1)"
        )
    return ("Latency: " + "; ".join(parts) + ".") if parts else ""


def block(records: dict[str, dict]) -> str:
    """The generated block, markers included."""
    sections = [table(slug, record) for slug, record in records.items()]
    return "\n".join([BEGIN, summary(records), "", *sections, END])


def rewrite(page: str, records: dict[str, dict]) -> str:
    """The page with its generated block replaced."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise MalformedResult(f"{PAGE.name}: no {BEGIN!r} … {END!r} block")
    return page[:start] + block(records) + page[end + len(END) :]


def keep(payload: dict, folder: Path = KEPT) -> Path:
    """Write a bench.engine payload (its `cpu` from `bench.cpu_info`) as a kept run (`--keep`);
    the page is remade apart."""
    now = datetime.now(UTC)
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    record = payload | {
        "source": "written by bench.engine --keep",
        "date": now.strftime("%Y-%m-%dT%H:%MZ"),
        "commit": commit or "unknown",
        "load": {
            "start": payload["machine"]["load_average_start"][0],
            "end": payload["machine"]["load_average_end"][0],
        },
    }
    slug, _ = kind(record["cpu"])
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{slug}-{now.strftime('%Y-%m-%d-%H%M')}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    read(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    wanted = rewrite(page, newest_by_kind())
    if args.check:
        if wanted != page:
            print(f"{PAGE} differs from bench/results/kept/: run `make bench-docs`")
            return 1
        return 0
    PAGE.write_text(wanted)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
