"""PNG charts of one benchmarks/performance.py run, drawn from its raw JSON.

    python benchmarks/plot.py [benchmarks/results/run-....json] [--output benchmarks/charts]

Without a path, the newest full run on the default loop under
benchmarks/results/ (``run-<stamp>.json``) is drawn, or else the newest run of
any kind. Bars are medians across trials;
whiskers span the min..max of the trials.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
COLORS = {
    "moderato": "#1f6feb",
    "moderato (tuned)": "#7c3aed",
    "limits": "#d97706",
    "fastapi-limiter": "#16a34a",
    "throttled-py": "#db2777",
}
MODE_COLORS = ["#64748b", "#93c5fd", "#3b82f6", "#1e3a8a"]


THOUSANDS = FuncFormatter(lambda value, _: f"{value / 1000:,.0f}k" if value else "0")


def newest_run() -> Path:
    # run-<stamp>.json is a full run on the default loop; suffixes mark the others.
    runs = [p for p in sorted(RESULTS.glob("run-*.json")) if p.stem.count("-") == 1]
    runs = runs or sorted(RESULTS.glob("run-*.json"))
    if not runs:
        raise SystemExit("no run-*.json under benchmarks/results/: run benchmarks/performance.py")
    return runs[-1]


def errors(stats: list[dict[str, Any]]) -> list[list[float]]:
    """Matplotlib's asymmetric error bars (below, above) from min..max around the median."""
    return [
        [s["median"] - s["min"] for s in stats],
        [s["max"] - s["median"] for s in stats],
    ]


def subtitle(run: dict[str, Any]) -> str:
    env = run["environment"]
    load = env.get("load_average_start", [])
    return (
        f"{env['cpu']}, {env['cores']} cores, Python {env['python']}, Redis {env['redis']}; "
        f"{'quick' if run['quick'] else 'full'} run, {run['config']['trials']} trials, "
        f"{run['started_at']}, load avg at start {load[0] if load else '?'}"
    )


def limiter_chart(run: dict[str, Any], section: str, title: str, path: Path) -> None:
    data = run["sections"][section]
    subjects = [s for s in data["subjects"] if "sequential" in s]
    modes = ["sequential"] + [str(t) for t in run["config"]["concurrency"]]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(subjects) * 1.4 + 2))
    height = 0.8 / len(modes)
    for index, mode in enumerate(modes):
        stats = [
            s["sequential"]["checks_per_s"]
            if mode == "sequential"
            else s["concurrent"][mode]["checks_per_s"]
            for s in subjects
        ]
        positions = [n + (index - (len(modes) - 1) / 2) * height for n in range(len(subjects))]
        label = "sequential" if mode == "sequential" else f"{mode} tasks"
        ax.barh(
            positions,
            [s["median"] for s in stats],
            height=height,
            xerr=errors(stats),
            color=MODE_COLORS[index % len(MODE_COLORS)],
            label=label,
            error_kw={"elinewidth": 0.8, "capsize": 1.5},
        )
    redis = run["sections"].get("redis")
    if redis and section == "limiter":
        for key, style, name in (
            ("c1_p1", ":", "redis-benchmark -c 1 -P 1 (floor)"),
            ("c50_p16", "--", "redis-benchmark -c 50 -P 16 (ceiling)"),
        ):
            ax.axvline(
                redis[key]["ops_per_s"]["median"], color="#dc2626", linestyle=style, label=name
            )
    ax.set_yticks(range(len(subjects)))
    ax.set_yticklabels([s["name"] for s in subjects])
    for tick, subject in zip(ax.get_yticklabels(), subjects):
        tick.set_color(COLORS.get(subject["library"], "black"))
    ax.invert_yaxis()
    ax.set_xlabel("checks per second (median; whiskers: min..max of trials)")
    ax.xaxis.set_major_formatter(THOUSANDS)
    ax.set_title(f"{title}\n{subtitle(run)}", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_chart(run: dict[str, Any], path: Path) -> None:
    subjects = [s for s in run["sections"]["limiter"]["subjects"] if "sequential" in s]
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(subjects) + 2))
    names = [s["name"] for s in subjects]
    for index, (field, color) in enumerate((("p50_us", "#93c5fd"), ("p99_us", "#1e3a8a"))):
        stats = [s["sequential"][field] for s in subjects]
        ax.barh(
            [n + (index - 0.5) * 0.4 for n in range(len(subjects))],
            [s["median"] for s in stats],
            height=0.4,
            xerr=errors(stats),
            color=color,
            label=field.replace("_us", ""),
            error_kw={"elinewidth": 0.8, "capsize": 1.5},
        )
    redis = run["sections"].get("redis")
    if redis:
        p50 = redis["c1_p1"]["p50_ms"]["median"] * 1000
        ax.axvline(p50, color="#dc2626", linestyle=":", label="redis-benchmark -c 1 -P 1 p50")
    ax.set_yticks(range(len(subjects)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("latency of one check, microseconds (sequential)")
    ax.set_title(f"Limiter only: sequential latency\n{subtitle(run)}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def e2e_chart(run: dict[str, Any], path: Path) -> None:
    data = run["sections"]["e2e"]["apps"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, metric, label in (
        (axes[0], "requests_per_s", "requests per second"),
        (axes[1], "p99_ms", "p99 latency, ms"),
    ):
        draw_e2e(ax, data, metric, label)
    fig.suptitle(
        f"End to end: FastAPI + uvicorn (1 process), "
        f"{run['sections']['e2e']['load_generator']}\n{subtitle(run)}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_e2e(ax: Axes, data: dict[str, Any], metric: str, label: str) -> None:
    names = list(data)
    for index, (path, color) in enumerate((("allowed", "#3b82f6"), ("limited", "#f59e0b"))):
        present = [n for n in names if path in data[n]]
        stats = [data[n][path][metric] for n in present]
        positions = [names.index(n) + (index - 0.5) * 0.4 for n in present]
        ax.bar(
            positions,
            [s["median"] for s in stats],
            width=0.4,
            yerr=errors(stats),
            color=color,
            label=f"/{path}",
            error_kw={"elinewidth": 0.8, "capsize": 2},
        )
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def bars_by_subject(ax: Axes, subjects: list[dict[str, Any]], stats: list[dict[str, Any]]) -> None:
    """One horizontal bar per subject (its median, min..max whiskers), top to bottom."""
    ax.barh(
        range(len(subjects)),
        [s["median"] for s in stats],
        xerr=errors(stats),
        color=[COLORS.get(s["library"], "grey") for s in subjects],
        error_kw={"elinewidth": 0.8, "capsize": 1.5},
    )
    ax.set_yticks(range(len(subjects)))
    ax.set_yticklabels([s["name"] for s in subjects], fontsize=8)
    ax.invert_yaxis()


def memory_chart(run: dict[str, Any], path: Path) -> None:
    scenarios = run["sections"]["memory"]["scenarios"]
    count = max(len(s["subjects"]) for s in scenarios)
    fig, axes = plt.subplots(1, len(scenarios), figsize=(7 * len(scenarios), 0.35 * count + 2.5))
    for ax, scenario in zip(axes if len(scenarios) > 1 else [axes], scenarios):
        subjects = [s for s in scenario["subjects"] if "sequential" in s]
        stats = [s["sequential"]["checks_per_s"] for s in subjects]
        bars_by_subject(ax, subjects, stats)
        ax.set_xlabel("checks per second, one task")
        ax.xaxis.set_major_formatter(THOUSANDS)
        ax.set_title(
            f"{scenario['name']}: '{scenario['rate']}', {scenario['identities']:,} "
            + ("identity" if scenario["identities"] == 1 else "identities"),
            fontsize=9,
        )
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"In process: memory:// vs limits' MemoryStorage\n{subtitle(run)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def server_cpu_chart(run: dict[str, Any], path: Path) -> None:
    """Redis CPU per decision: each algorithm's moderato script beside its peer's."""
    data = run["sections"]["server_cpu"]
    by_name = {s["name"]: s for s in data["subjects"]}
    rows = []
    for ratio in data["ratios"]:
        rows.append(by_name[f"moderato {ratio['algorithm']}"])
        floor = by_name.get(f"spec floor {ratio['algorithm']}")
        rows += [floor] if floor else []
        rows.append(by_name[ratio["peer"]])
    rows += [s for s in data["subjects"] if s["library"] == "reference"]
    stats = [s["us_per_decision"] for s in rows]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.8))
    bars_by_subject(ax, rows, stats)
    ax.set_xlabel("Redis server CPU per decision, µs (lower is better)")
    ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Redis CPU per decision, one script per call\n{subtitle(run)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("run", nargs="?", type=Path, help="a run-*.json (default: the newest)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "charts")
    args = parser.parse_args()
    source = args.run or newest_run()
    run = json.loads(source.read_text())
    if run.get("kind") != "performance-run":
        raise SystemExit(f"{source} is not a benchmarks/performance.py run")
    args.output.mkdir(parents=True, exist_ok=True)
    sections = run["sections"]
    drawn = []
    if sections.get("limiter", {}).get("subjects"):
        limiter_chart(
            run,
            "limiter",
            "Limiter only: checks/s against one Redis",
            args.output / "limiter_only.png",
        )
        latency_chart(run, args.output / "limiter_latency.png")
        drawn += ["limiter_only.png", "limiter_latency.png"]
    if sections.get("e2e", {}).get("apps"):
        e2e_chart(run, args.output / "end_to_end.png")
        drawn.append("end_to_end.png")
    if sections.get("memory", {}).get("scenarios"):
        memory_chart(run, args.output / "in_process.png")
        drawn.append("in_process.png")
    if sections.get("cluster", {}).get("subjects"):
        limiter_chart(
            run,
            "cluster",
            "Cluster: the limiter-only test on 3 primaries",
            args.output / "cluster.png",
        )
        drawn.append("cluster.png")
    if sections.get("server_cpu", {}).get("subjects"):
        server_cpu_chart(run, args.output / "server_cpu.png")
        drawn.append("server_cpu.png")
    print(f"{source.name} -> {', '.join(drawn)} in {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
