"""Access control on the hot path: 100-byte appends with an auth file and a bearer token, and without.

``python -m bench.auth_appends [--repeat N] [--duration S] [--json PATH]``
starts two segstore servers as ``make run`` does, one with an auth file
(``SEGSTORE_AUTH_FILE``, several tokens; every append carries one of them as
``Authorization: Bearer``) and one without, and runs the same closed-loop
load (64 keep-alive connections appending 100 bytes to one segment) against
each in turn, alternating which goes first. Each pair of runs gives one
ratio, appends/s with auth over without: the token is judged in the WSGI
shortcut that serves the append, so it should cost little (target: at least
0.9). The report gives min / median / max of the ratios and the load
average before and after, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from bench.appends import SERVER_ENV, SMALL_APPEND_BYTES
from bench.common import Spread, create_segment, progress, run_in_workdir, tier1_metric
from bench.load import LoadResult, LoadSpec, run_load
from bench.servers import ServerProcess

CONNECTIONS = 64
TOKENS = 8  # in the auth file: the server compares a token with each of them
TARGET_RATIO = 0.9


def write_auth_file(path: Path) -> str:
    """An auth file of ``TOKENS`` tokens, each writing its own prefix; returns the one that writes bench/."""
    tokens = [secrets.token_urlsafe(24) for _ in range(TOKENS)]
    prefixes = [f"tenant-{i}/" for i in range(TOKENS - 1)] + ["bench/"]
    path.write_text(
        "".join(
            f'[[token]]\nname = "client-{i}"\ntoken = "{token}"\n'
            f'grants = [{{prefix = "{prefix}", access = "write"}}]\n\n'
            for i, (token, prefix) in enumerate(zip(tokens, prefixes, strict=True))
        )
    )
    return tokens[-1]


def _run(
    args: argparse.Namespace, server: ServerProcess, headers: dict[str, str], segment: str
) -> LoadResult:
    """One closed-loop run of 100-byte appends to a new ``segment``, every request with ``headers``."""
    create_segment(server, segment, headers)
    spec = LoadSpec(
        server.port,
        segment,
        SMALL_APPEND_BYTES,
        args.connections,
        args.warmup_s,
        args.duration_s,
        headers=tuple(headers.items()),
    )
    return run_load(spec, args.client_processes, server, partial(tier1_metric, server, headers))


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Alternate runs with auth off and on (the first of each pair alternates too); the JSON document."""
    auth_file = workdir / "auth.toml"
    bearer = {"Authorization": f"Bearer {write_auth_file(auth_file)}"}
    doc: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1m_before": os.getloadavg()[0],
        },
        "plan": {k: v for k, v in vars(args).items() if k not in ("json", "dir")},
    }
    runs: dict[str, list[LoadResult]] = {"off": [], "on": []}
    with (
        ServerProcess(workdir / "off", env=SERVER_ENV) as off,
        ServerProcess(workdir / "on", env={**SERVER_ENV, "SEGSTORE_AUTH_FILE": str(auth_file)}) as on,
    ):
        servers = {"off": (off, {}), "on": (on, bearer)}
        for r in range(args.repeat):
            for kind in ("off", "on") if r % 2 == 0 else ("on", "off"):
                progress(f"pair {r + 1}/{args.repeat}: auth {kind}")
                server, headers = servers[kind]
                runs[kind].append(_run(args, server, headers, f"bench/auth-{kind}-r{r}"))
    doc["machine"]["loadavg_1m_after"] = os.getloadavg()[0]
    doc["runs"] = {kind: [asdict(run) for run in results] for kind, results in runs.items()}
    pairs = list(zip(runs["on"], runs["off"], strict=True))
    doc["on_over_off"] = asdict(Spread.of([a.requests_per_s / b.requests_per_s for a, b in pairs]))
    # Appends per second of the server's CPU: what a load stealing CPU from the server changes least.
    doc["per_cpu_on_over_off"] = asdict(Spread.of([_per_cpu(a) / _per_cpu(b) for a, b in pairs]))
    return doc


def _per_cpu(run: LoadResult) -> float:
    return run.requests_per_s / run.server_cpu


def render(doc: dict[str, Any]) -> str:
    """The human-readable report of a ``measure`` document."""
    machine, plan, ratio = doc["machine"], doc["plan"], doc["on_over_off"]
    lines = [
        f"auth on the append path: {machine['cpus']} CPUs, Python {machine['python']}, "
        f"1-minute load average {machine['loadavg_1m_before']:.2f} before, "
        f"{machine['loadavg_1m_after']:.2f} after",
        f"{plan['repeat']} pairs of runs, {plan['connections']} connections of 100-byte appends, "
        f"{plan['duration_s']:g} s after {plan['warmup_s']:g} s of warm-up; "
        f"auth on: {TOKENS} tokens in the file",
        "",
        f"  {'pair':>4}  {'off appends/s':>14}  {'on appends/s':>13}  {'on/off':>7}  "
        f"{'ops/T1 write off/on':>20}  {'server CPU off/on':>18}",
    ]
    for i, (off, on) in enumerate(zip(doc["runs"]["off"], doc["runs"]["on"], strict=True)):
        ops = "/".join(f"{r['ops_per_tier1_write'] or 0:.1f}" for r in (off, on))
        cpu = "/".join(f"{r['server_cpu']:.0%}" for r in (off, on))
        lines.append(
            f"  {i + 1:>4}  {off['requests_per_s']:>14,.0f}  {on['requests_per_s']:>13,.0f}  "
            f"{on['requests_per_s'] / off['requests_per_s']:>7.3f}  {ops:>20}  {cpu:>18}"
        )
    met = "met" if ratio["median"] >= TARGET_RATIO else "NOT met"
    lines += [
        "",
        "  on / off, paired (min / median / max):",
        f"    appends/s:                 {_show(ratio)}  [target >= {TARGET_RATIO}: {met}]",
        f"    appends per server CPU-s:  {_show(doc['per_cpu_on_over_off'])}",
    ]
    return "\n".join(lines)


def _show(spread: dict[str, float]) -> str:
    return Spread(spread["min"], spread["median"], spread["max"]).show("{:.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the pairs, print the report, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.auth_appends", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="pairs of runs (auth off and on)")
    parser.add_argument("--duration", dest="duration_s", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--warmup", dest="warmup_s", type=float, default=2.0, help="warm-up seconds per run")
    parser.add_argument("--connections", type=int, default=CONNECTIONS, help="concurrent connections")
    parser.add_argument("--client-processes", type=int, default=1, help="load generator processes")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary data dirs go")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    return run_in_workdir("segstore-auth-bench-", args.dir, lambda d: measure(args, d), render, args.json)


if __name__ == "__main__":
    sys.exit(main())
