"""Markdown tables of one benchmarks/performance.py run, for BENCHMARKS.md.

    python benchmarks/tables.py [benchmarks/results/run-....json]

Prints the environment, every section and the targets as Markdown, straight
from the raw JSON (the newest full run by default), so the published tables
are the recorded numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Optional

from plot import newest_run


def rate(stats: Optional[dict[str, Any]], digits: int = 0) -> str:
    """'median [min..max]' of a summary."""
    if not stats or stats.get("median") is None:
        return "n/a"
    f = f"{{:,.{digits}f}}"
    return f"{f.format(stats['median'])} [{f.format(stats['min'])}..{f.format(stats['max'])}]"


def median(stats: Optional[dict[str, Any]], digits: int = 0) -> str:
    if not stats or stats.get("median") is None:
        return "n/a"
    return f"{stats['median']:,.{digits}f}"


def environment(run: dict[str, Any]) -> str:
    env = run["environment"]
    packages = ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
    rows = [
        ("started (UTC)", run["started_at"]),
        ("run", f"{'quick' if run['quick'] else 'full'}, {run['config']['trials']} trials, "
                f"{run['duration_s']:.0f} s"),
        ("CPU", f"{env['cpu']}, {env['cores']} cores"),
        ("OS", env["platform"]),
        ("Python", f"{env['python_implementation']} {env['python']}"),
        ("Redis", f"{env['redis']} ({env['redis_benchmark']})"),
        ("wrk", env["wrk"]),
        ("uvicorn", f"loop {env['uvicorn_loop']}, http {env['uvicorn_http']}"),
        ("packages", packages),
        ("git commit", env["git_commit"]),
        ("load average (1, 5, 15 min)",
         f"start {env.get('load_average_start')}, end {env.get('load_average_end')}"),
    ]  # fmt: skip
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def redis_table(run: dict[str, Any]) -> str:
    redis = run["sections"].get("redis")
    if not redis:
        return "(not run)"
    lines = ["| redis-benchmark | ops/s median [min..max] | p50 ms | p99 ms |", "|---|---|---|---|"]
    for key, label in (("c1_p1", "-c 1 -P 1 (floor)"), ("c50_p16", "-c 50 -P 16 (ceiling)")):
        stats = redis[key]
        lines.append(
            f"| {label} | {rate(stats['ops_per_s'])} | {median(stats['p50_ms'], 3)} "
            f"| {median(stats['p99_ms'], 3)} |"
        )
    return (
        "\n".join(lines)
        + f"\n\nCommand: `redis-benchmark -r {redis['identities']} "
        + (f"{redis['command']}`")
    )


def limiter_table(run: dict[str, Any], section: str) -> str:
    data = run["sections"].get(section)
    if not data or not data.get("subjects"):
        return f"(not run{': ' + data['skipped'] if data and 'skipped' in data else ''})"
    tasks = [str(t) for t in run["config"]["concurrency"]]
    header = "| subject | algorithm | sequential checks/s | p50 µs | p99 µs | " + " | ".join(
        f"{t} tasks checks/s" for t in tasks
    )
    lines = [header + " |", "|---|---|---|---|---|" + "---|" * len(tasks)]
    for subject in data["subjects"]:
        if "sequential" not in subject:
            lines.append(f"| {subject['name']} | {subject['algorithm']} | setup failed: "
                         f"{subject.get('setup_error', '?')} |")  # fmt: skip
            continue
        seq = subject["sequential"]
        cells = [
            subject["name"],
            subject["algorithm"],
            rate(seq["checks_per_s"]),
            median(seq["p50_us"]),
            median(seq["p99_us"]),
        ]
        for t in tasks:
            cells.append(rate(subject["concurrent"].get(t, {}).get("checks_per_s")))
        lines.append("| " + " | ".join(cells) + " |")
    problems = [
        f"{s['name']}: {s['sequential']['errors']} errors, {s['sequential']['denied']} denied"
        for s in data["subjects"]
        if "sequential" in s and (s["sequential"]["errors"] or s["sequential"]["denied"])
    ]
    if problems:
        lines.append("\nProblems: " + "; ".join(problems))
    ratios = data.get("vs_single_node")
    if ratios:
        modes = list(next(iter(ratios.values())))
        lines += ["", "| cluster / single node | " + " | ".join(modes) + " |",
                  "|---|" + "---|" * len(modes)]  # fmt: skip
        for name, values in ratios.items():
            lines.append(f"| {name} | " + " | ".join(f"{values[m]:.2f}" for m in modes) + " |")
    return "\n".join(lines)


def memory_tables(run: dict[str, Any]) -> str:
    data = run["sections"].get("memory")
    if not data or not data.get("scenarios"):
        return "(not run)"
    parts = []
    for scenario in data["scenarios"]:
        lines = [
            f"**{scenario['name']}**: rate `{scenario['rate']}`, {scenario['identities']:,} "
            f"{'identity' if scenario['identities'] == 1 else 'identities in turn'}, one task\n",
            "| subject | algorithm | checks/s median [min..max] | p50 µs | p99 µs | denied |",
            "|---|---|---|---|---|---|",
        ]
        for subject in scenario["subjects"]:
            seq = subject.get("sequential")
            if not seq:
                continue
            denied = seq["denied"] / seq["checks"] if seq["checks"] else 0.0
            lines.append(
                f"| {subject['name']} | {subject['algorithm']} | {rate(seq['checks_per_s'])} | "
                f"{median(seq['p50_us'], 1)} | {median(seq['p99_us'], 1)} | {denied:.0%} |"
            )
        parts.append("\n".join(lines))
    layers = data.get("layers")
    if layers and "error" in layers:
        parts.append(f"Layers: not measured ({layers['error']})")
    elif layers:
        lines = [
            f"Layers of one check ({layers['unit']}):\n",
            "| algorithm | MemoryStore.decide (C) | MemoryBackend.decide | "
            "RateLimiter.check_with_info |",
            "|---|---|---|---|",
        ]
        for algorithm, values in layers["algorithms"].items():
            lines.append(
                f"| {algorithm} | {median(values['store'])} ns | {median(values['backend'])} ns | "
                f"{median(values['limiter'])} ns |"
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def concurrency_latency_table(run: dict[str, Any]) -> str:
    data = run["sections"].get("limiter")
    if not data:
        return "(not run)"
    tasks = [str(t) for t in run["config"]["concurrency"]]
    lines = [
        "| subject | " + " | ".join(f"{t} tasks p50 / p99 ms" for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for subject in data["subjects"]:
        if "sequential" not in subject:
            continue
        cells = [subject["name"]]
        for t in tasks:
            stats = subject["concurrent"].get(t)
            if not stats:
                cells.append("n/a")
                continue
            p50_ms = stats["p50_us"]["median"] / 1000
            cells.append(f"{p50_ms:.2f} / {stats['p99_us']['median'] / 1000:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def e2e_table(run: dict[str, Any]) -> str:
    data = run["sections"].get("e2e")
    if not data or not data.get("apps"):
        return f"(not run{': ' + data['skipped'] if data and 'skipped' in data else ''})"
    lines = [
        "| app | path | req/s median [min..max] | p50 ms | p90 ms | p99 ms | app CPU µs/req "
        "| responses as expected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, app in data["apps"].items():
        if "start_error" in app:
            lines.append(f"| {name} | | could not be started: {app['start_error'][-200:]} |||||")
        for path in ("allowed", "limited"):
            stats = app.get(path)
            if not stats:
                continue
            lines.append(
                f"| {name} | /{path} | {rate(stats['requests_per_s'])} | "
                f"{median(stats['p50_ms'], 2)} | {median(stats['p90_ms'], 2)} | "
                f"{median(stats['p99_ms'], 2)} | {median(stats.get('app_cpu_us_per_request'))} | "
                f"{'yes' if stats['as_expected'] else 'NO'} ({stats['expected']}) |"
            )
    return "\n".join(lines)


def server_cpu_table(run: dict[str, Any], before: Optional[dict[str, Any]] = None) -> str:
    """Redis CPU per decision of every script; with `before`, that run's figures beside."""
    data = run["sections"].get("server_cpu")
    if not data:
        return "(not run)"
    earlier = {}
    if before and before["sections"].get("server_cpu"):
        earlier = {s["name"]: s for s in before["sections"]["server_cpu"]["subjects"]}
    columns = ["script", "µs/decision median [min..max]", "ops/s (-c 50 -P 16)", "calls/decision"]
    if earlier:
        columns.insert(1, "µs/decision before")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for subject in data["subjects"]:
        calls = ", ".join(
            f"{name.upper()} {count:.2f}".replace(".00", "")
            for name, count in subject["redis_calls_per_decision"].items()
        )
        cells = [subject["name"]]
        if earlier:
            cells.append(median(earlier.get(subject["name"], {}).get("us_per_decision"), 2))
        cells += [rate(subject["us_per_decision"], 2), median(subject["ops_per_s"]), calls]
        lines.append("| " + " | ".join(cells) + " |")
    ratios = [
        "| algorithm | peer script | moderato µs | peer µs | ratio | spec floor µs (÷ peer) |",
        "|" + "---|" * 6,
    ]
    for ratio in data["ratios"]:
        floor = ""
        if "floor_us" in ratio:
            floor = f"{ratio['floor_us']:.2f} ({ratio['floor_ratio']:.2f}x)"
        ratios.append(
            f"| {ratio['algorithm']} | {ratio['peer']} | {ratio['moderato_us']:.2f} "
            f"| {ratio['peer_us']:.2f} | {ratio['ratio']:.2f}x | {floor} |"
        )
    return (
        "\n".join(lines)
        + "\n\n"
        + "\n".join(ratios)
        + f"\n\nMethod: {data['what']}; {data['trials']} trials, median. Rate {data['limit']}; "
        + f"3 policies: {data['three_policies']}."
    )


def targets_table(run: dict[str, Any]) -> str:
    lines = ["| target | measured | threshold | met | figures |", "|---|---|---|---|---|"]
    for target in run["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[target["met"]]
        value = "n/a" if target["value"] is None else f"{target['value']:.2f}"
        threshold = _threshold(target["threshold"])
        if target["threshold"] is None:
            met = "—"
        lines.append(f"| {target['target']} | {value} | {threshold} | {met} | {target['detail']} |")
    return "\n".join(lines)


def targets_by_run(runs: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Every target name in first-seen order, and per run its measured targets by name."""
    names: list[str] = []
    by_run: list[dict[str, Any]] = []
    for run in runs:
        measured = {t["target"]: t for t in run["targets"] if t["value"] is not None}
        by_run.append(measured)
        names += [name for name in measured if name not in names]
    return names, by_run


def _threshold(threshold: Optional[float]) -> str:
    return "reference" if threshold is None else f"≥ {threshold}"


def targets_across(paths: list[Path]) -> str:
    """Each target's ratio in several runs, side by side (a run lacking it shows n/a)."""
    runs = [json.loads(path.read_text()) for path in paths]
    names, by_run = targets_by_run(runs)
    header = " | ".join(
        f"{run['started_at'][11:16]} UTC"
        + (" uvloop" if run["config"].get("loop") == "uvloop" else "")
        for run in runs
    )
    lines = [f"| target | threshold | {header} |", "|---|---|" + "---|" * len(runs)]
    for name in names:
        found = [measured.get(name) for measured in by_run]
        threshold = next(t for t in found if t is not None)["threshold"]
        cells = [
            "n/a"
            if target is None
            else f"{target['value']:.2f}" + ("" if target["met"] or threshold is None else " ✗")
            for target in found
        ]
        lines.append(f"| {name} | {_threshold(threshold)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_summary(paths: list[Path]) -> str:
    """Each target over several runs: the median ratio, the range, and how often it was met."""
    runs = [json.loads(path.read_text()) for path in paths]
    names, by_run = targets_by_run(runs)
    lines = [
        f"| target | threshold | median of {len(runs)} runs [range] | met in |",
        "|---|---|---|---|",
    ]
    for name in names:
        targets = [measured[name] for measured in by_run if name in measured]
        values = [t["value"] for t in targets]
        threshold = targets[0]["threshold"]
        spread = f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"
        if threshold is None:
            verdict = "—"
        else:
            met = sum(1 for t in targets if t["met"])
            verdict = f"{met} of {len(targets)}" if met else f"**0 of {len(targets)}**"
        lines.append(f"| {name} | {_threshold(threshold)} | {spread} | {verdict} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("run", nargs="?", type=Path)
    parser.add_argument(
        "--server-cpu-before",
        type=Path,
        metavar="RUN",
        help="print only the server-CPU table, with this earlier run's figures beside",
    )
    parser.add_argument(
        "--targets", nargs="+", type=Path, metavar="RUN", help="only the targets of these runs"
    )
    parser.add_argument(
        "--summary", nargs="+", type=Path, metavar="RUN", help="each target over these runs"
    )
    args = parser.parse_args()
    if args.targets:
        print(targets_across(args.targets))
        return
    if args.summary:
        print(targets_summary(args.summary))
        return
    source = args.run or newest_run()
    run = json.loads(source.read_text())
    if args.server_cpu_before:
        before = json.loads(args.server_cpu_before.read_text())
        print(server_cpu_table(run, before))
        return
    parts = [
        f"<!-- generated by benchmarks/tables.py from {source.name} -->",
        "### Environment\n\n" + environment(run),
        "### Targets\n\n" + targets_table(run),
        "### Redis floor and ceiling\n\n" + redis_table(run),
        "### Limiter only\n\n" + limiter_table(run, "limiter"),
        "Latency of one check under concurrency (includes queueing):\n\n"
        + concurrency_latency_table(run),
        "### End to end\n\n" + e2e_table(run),
        "### In process\n\n" + memory_tables(run),
        "### Cluster\n\n" + limiter_table(run, "cluster"),
        "### Redis server CPU per decision\n\n" + server_cpu_table(run),
    ]
    print("\n\n".join(parts))


if __name__ == "__main__":
    main()
