"""is-study's benchmark suite: every figure is a ratio or a bound measured side by side in one run.

    python scripts/bench.py                 # full size, prints a table, writes bench.json
    python scripts/bench.py --tiny          # a seconds-long smoke run (CI proves it runs)
    python scripts/bench.py --only correction,cli

Timings use torch.utils.benchmark (warm-up, then medians of blocked runs); the two sides of a ratio
are measured in alternating rounds so that background load hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


@dataclass
class Result:
    name: str
    value: float
    target: str
    passed: bool | None  # None: a figure shown for context, with no target to meet
    detail: str = ""


def _median_ratio(fn_a, fn_b, rounds: int, min_run_time: float) -> tuple[float, float, float]:
    """Median time of fn_a and fn_b (seconds) and the median of per-round ratios a/b."""
    from torch.utils import benchmark

    ta, tb, ratios = [], [], []
    for _ in range(rounds):
        a = benchmark.Timer(stmt="f()", globals={"f": fn_a}).blocked_autorange(min_run_time=min_run_time).median
        b = benchmark.Timer(stmt="f()", globals={"f": fn_b}).blocked_autorange(min_run_time=min_run_time).median
        ta.append(a)
        tb.append(b)
        ratios.append(a / b)
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


# ------------------------------------------------------------------------------ 1. correction
def _synthetic_batch(B: int, T: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(B, T, generator=g)
    roll = old + 0.05 * torch.randn(B, T, generator=g)
    lp = old + 0.01 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    lengths = torch.randint(T // 2, T + 1, (B, 1), generator=g)
    mask = (torch.arange(T)[None, :] < lengths).float()
    return lp, old, roll, adv, mask


def bare_seq_mask_tis(lp, old, roll, adv, mask, low=0.5, high=5.0, eps=0.2):
    """The same formula as `seq-mask-tis` + PPO + token-mean, inline, with no metrics and none of
    the padding sanitisation (so it is *not* safe against NaN padding)."""
    import torch

    lr = old - roll
    w = lr.exp().clamp(low, high)
    g = (lr * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    rho_geo = g.exp()
    coef = torch.where((rho_geo >= low) & (rho_geo <= high), w, 0.0)
    r = (lp - old).clamp(-20, 20).exp()
    per_token = -torch.minimum(r * adv, r.clamp(1 - eps, 1 + eps) * adv)
    return (per_token * coef * mask).sum() / mask.sum().clamp(min=1)


def bare_seq_mask_tis_nan_safe(lp, old, roll, adv, mask, low=0.5, high=5.0, eps=0.2):
    """The same inline formula, hardened as our presets are: NaN/inf at padding can reach neither
    the loss nor the gradient (one where on each difference and on the advantage)."""
    import torch

    inside = mask > 0
    lr = torch.where(inside, old - roll, 0.0)
    w = lr.exp().clamp(low, high)
    g = lr.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    rho_geo = g.exp()
    coef = torch.where(((rho_geo >= low) & (rho_geo <= high)) & inside, w, 0.0)
    r = torch.where(inside, lp - old, 0.0).clamp(-20, 20).exp()
    a = torch.where(inside, adv, 0.0)
    per_token = -torch.minimum(r * a, r.clamp(1 - eps, 1 + eps) * a)
    return (per_token * coef).sum() / mask.sum().clamp(min=1)


def bench_correction(tiny: bool) -> list[Result]:
    """The median over fresh processes: within one process the allocator's history (glibc's
    adaptive mmap and trim thresholds decide which [B, T] tensors cost page faults) moves a ratio by
    up to 2x from one run to the next."""
    if tiny:
        return _bench_correction_once(tiny)
    code = (
        f"import sys, json; sys.path.insert(0, {str(REPO)!r}); from scripts.bench import _bench_correction_once; "
        "print(json.dumps([r.__dict__ for r in _bench_correction_once(False)]))"
    )
    runs = []
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip().splitlines()[-1])
        runs.append([Result(**r) for r in json.loads(res.stdout.strip().splitlines()[-1])])
    out = []
    for rows in zip(*runs):
        values = sorted(r.value for r in rows)
        mid = statistics.median(values)
        target = float(rows[0].target.strip("<= x"))
        out.append(
            Result(
                rows[0].name,
                mid,
                rows[0].target,
                mid <= target,
                f"median of {len(rows)} processes (range {values[0]:.2f}–{values[-1]:.2f}); "
                + min(rows, key=lambda r: abs(r.value - mid)).detail,
            )
        )
    return out


def _bench_correction_once(tiny: bool) -> list[Result]:
    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec, policy_loss

    B, T = (8, 256) if tiny else (64, 4096)
    lp0, old, roll, adv, mask = _synthetic_batch(B, T)
    corr = Correction(name="seq-mask-tis", weight="token", weight_op="clamp", filter="geometric", low=0.5, high=5.0)
    spec = LossSpec()

    def ours(metrics: bool):
        def run():
            lp = lp0.clone().requires_grad_(True)
            policy_loss(spec, corr, lp, old, roll, adv, mask, metrics=metrics).loss.backward()

        return run

    def bare():
        lp = lp0.clone().requires_grad_(True)
        bare_seq_mask_tis(lp, old, roll, adv, mask).backward()

    def bare_safe():
        lp = lp0.clone().requires_grad_(True)
        bare_seq_mask_tis_nan_safe(lp, old, roll, adv, mask).backward()

    rounds, mrt = (1, 0.05) if tiny else (5, 0.4)
    out = []
    for label, reference in (("bare", bare), ("bare NaN-safe", bare_safe)):
        for metrics, target in ((True, 1.3), (False, 1.05)):
            t_ours, t_ref, ratio = _median_ratio(ours(metrics), reference, rounds, mrt)
            out.append(
                Result(
                    f"seq-mask-tis loss vs {label} inline torch, metrics={'on' if metrics else 'off'} "
                    f"(B={B}, T={T}, fwd+bwd)",
                    ratio,
                    f"<= {target}x",
                    ratio <= target,
                    f"ours {t_ours * 1e3:.2f} ms vs {label} {t_ref * 1e3:.2f} ms",
                )
            )
    return out


# ------------------------------------------------------------------------------ 4. long sequences
_MEMORY_PROBE = r"""
import sys, json
sys.path.insert(0, {repo!r})
import torch
torch.set_num_threads(1)
from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss
from scripts.bench import _synthetic_batch

def hwm_kb():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1])

def rss_kb():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])

B, T = {B}, {T}
lp0, old, roll, adv, mask = _synthetic_batch(B, T)
lp = lp0.clone().requires_grad_(True)
corr = Correction(name='seq-mask-tis', weight='token', weight_op='clamp', filter='geometric', low=0.5, high=5.0)
# warm up the code paths on a small batch so one-off allocations are not counted
small = [t[:, :64].contiguous() for t in (lp0, old, roll, adv, mask)]
policy_loss(LossSpec(), corr, small[0].requires_grad_(True), *small[1:], metrics={metrics}).loss.backward()
input_bytes = sum(t.numel() * t.element_size() for t in (lp, old, roll, adv, mask))
open('/proc/self/clear_refs', 'w').write('5')  # reset the peak-RSS mark
base = rss_kb()
policy_loss(LossSpec(), corr, lp, old, roll, adv, mask, metrics={metrics}).loss.backward()
print(json.dumps({{'input_bytes': input_bytes, 'peak_delta_bytes': (hwm_kb() - base) * 1024}}))
"""


def _peak_memory(B: int, T: int, metrics: bool) -> dict:
    code = _MEMORY_PROBE.format(repo=str(REPO), B=B, T=T, metrics=metrics)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip().splitlines()[-1])
    return json.loads(res.stdout.strip().splitlines()[-1])


def bench_long_sequences(tiny: bool) -> list[Result]:
    T = 4096 if tiny else 32768
    out = []
    for metrics in (True, False):
        # the peak-RSS mark moves with the allocator's whims: median of fresh processes
        runs = [_peak_memory(8, T, metrics) for _ in range(3 if tiny else 5)]
        peaks = sorted(r["peak_delta_bytes"] for r in runs)
        inputs = runs[0]["input_bytes"]
        ratio = statistics.median(peaks) / inputs
        out.append(
            Result(
                f"long sequences peak memory / inputs, metrics={'on' if metrics else 'off'} (B=8, T={T}, fwd+bwd)",
                ratio,
                "<= 3x",
                ratio <= 3.0,
                f"median peak +{statistics.median(peaks) / 2**20:.1f} MiB (max {peaks[-1] / 2**20:.1f}) "
                f"for {inputs / 2**20:.1f} MiB of inputs, {len(runs)} processes",
            )
        )
    # linear, not quadratic, in T: time at 4T over time at T
    from torch.utils import benchmark

    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec, policy_loss

    corr = Correction(name="seq-mask-tis", weight="token", weight_op="clamp", filter="geometric", low=0.5, high=5.0)
    times = {}
    # both sizes well past the L2 cache, so the ratio shows the algorithm, not the cache
    for t_len in (1024, 4096) if tiny else (32768, 131072):
        lp0, old, roll, adv, mask = _synthetic_batch(8, t_len)

        def run(lp0=lp0, old=old, roll=roll, adv=adv, mask=mask):
            lp = lp0.clone().requires_grad_(True)
            policy_loss(LossSpec(), corr, lp, old, roll, adv, mask).loss.backward()

        times[t_len] = (
            benchmark.Timer(stmt="f()", globals={"f": run}).blocked_autorange(min_run_time=0.1 if tiny else 0.5).median
        )
    (t1, a), (t2, b) = sorted(times.items())
    scale = b / a
    out.append(
        Result(
            f"time scaling T={t1}→{t2} (×{t2 // t1} tokens)",
            scale,
            f"<= {1.5 * t2 / t1:.0f}x (linear)",
            scale <= 1.5 * t2 / t1,
            f"{a * 1e3:.2f} ms → {b * 1e3:.2f} ms",
        )
    )
    return out


# ------------------------------------------------------------------------------ 5. CLI latency
_IMPORT_PROBE = (
    "import sys; from runner import cli; sys.argv=['is-study', {arg!r}]\n"
    "try: cli.main()\nexcept SystemExit: pass\n"
    "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)"
)


def _cold(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, cwd=REPO, env={**os.environ, "COLUMNS": "100"})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_cli(tiny: bool) -> list[Result]:
    repeats = 3 if tiny else 7
    baseline = _cold([sys.executable, "-c", "pass"], repeats)
    out = []
    for arg in ("--help", "list"):
        seconds = _cold([sys.executable, "-m", "runner", arg], repeats)
        probe = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE.format(arg=arg)], capture_output=True, text=True, cwd=REPO
        )
        no_torch = "NO-TORCH" in probe.stderr
        out.append(
            Result(
                f"CLI latency `is-study {arg}` (cold process)",
                seconds,
                "< 0.5 s, no torch import",
                seconds < 0.5 and no_torch,
                f"python -c pass {baseline * 1e3:.0f} ms; ratio {seconds / baseline:.1f}x; "
                f"torch imported: {'no' if no_torch else 'YES'}",
            )
        )
    return out


# ------------------------------------------------------------------------------ the others
def _script_results(script: str, tiny: bool) -> list[Result]:
    """The train, probe and sweep benches live beside their studies; they print JSON with --out."""
    path = REPO / "scripts" / script
    if not path.is_file():
        return [Result(f"{script}", float("nan"), "-", False, "script missing")]
    out_file = REPO / f".bench-{path.stem}.json"
    cmd = [sys.executable, str(path), "--out", str(out_file)] + (["--tiny"] if tiny else [])
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if res.returncode not in (0, 1) or not out_file.is_file():
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return [Result(f"{script}", float("nan"), "-", False, f"failed: {tail[0]}")]
    rows = json.loads(out_file.read_text())
    out_file.unlink()
    if isinstance(rows, dict):  # bench_sweep.py's richer record
        rows = _sweep_rows(rows)
    return [
        Result(
            r["name"], r["value"], str(r["target"]), None if r["pass"] is None else bool(r["pass"]), r.get("detail", "")
        )
        for r in rows
    ]


def _sweep_rows(fig: dict) -> list[dict]:
    steady, targets = fig["steady"], fig["targets"]
    basic = steady["basic"]
    size = f"{fig['jobs']} jobs × {fig['steps']} steps"
    return [
        {
            "name": f"sweep overhead per job, basic launcher ({size})",
            "value": basic["overhead_ms_per_job"],
            "target": f"<= {targets['overhead_ms_per_job']:g} ms",
            "pass": targets["overhead_ok"],
            "detail": f"wall {basic['wall_s']:.2f} s, in-job compute {basic['compute_s']:.2f} s",
        },
        {
            "name": f"sweep joblib speedup, {fig['workers']} workers over basic ({size})",
            "value": steady["speedup"],
            "target": f">= {targets['speedup']:g}x",
            "pass": targets["speedup_ok"],
            "detail": f"joblib wall {steady['joblib']['wall_s']:.2f} s",
        },
    ]


BENCHES = {
    "correction": bench_correction,
    "train": lambda tiny: _script_results("bench_train.py", tiny),
    "probe": lambda tiny: _script_results("bench_probe.py", tiny),
    "long": bench_long_sequences,
    "cli": bench_cli,
    "sweep": lambda tiny: _script_results("bench_sweep.py", tiny),
    "mlp": lambda tiny: _script_results("bench_mlp.py", tiny),
    "transformer": lambda tiny: _script_results("bench_transformer.py", tiny),
    "regime": lambda tiny: _script_results("bench_regime.py", tiny),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out",
        default="bench.json",
        help="JSON output: a list of {name, value, target, pass} (pass is null for a context figure)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: proves the suite runs, measures nothing")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHES)}")
    args = parser.parse_args()
    chosen = [b.strip() for b in args.only.split(",") if b.strip()] or list(BENCHES)
    unknown = [b for b in chosen if b not in BENCHES]
    if unknown:
        print(f"bench: unknown benchmark(s) {', '.join(unknown)}; valid: {', '.join(BENCHES)}", file=sys.stderr)
        return 2

    from rich.console import Console
    from rich.table import Table

    results: list[Result] = []
    console = Console(stderr=True)
    for name in chosen:
        with console.status(f"bench: {name}"):
            results.extend(BENCHES[name](args.tiny))
    table = Table(
        title=f"is-study benchmarks ({'tiny' if args.tiny else 'full'}; {os.cpu_count()} CPUs)", title_justify="left"
    )
    for col in ("benchmark", "figure", "target", "pass", "detail"):
        table.add_column(col)
    for r in results:
        verdict = "—" if r.passed is None else "[green]pass[/green]" if r.passed else "[red]FAIL[/red]"
        table.add_row(r.name, f"{r.value:.3g}", r.target, verdict, r.detail)
    Console(width=200).print(table)
    Path(args.out).write_text(
        json.dumps(
            [
                {"name": r.name, "value": r.value, "target": r.target, "pass": r.passed, "detail": r.detail}
                for r in results
            ],
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
