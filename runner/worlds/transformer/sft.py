"""The SFT warm start: supervised training on a noisy teacher, so that RL starts where LLM RL starts
(a policy that is often right, sure of most tokens, unsure at a few "fork" tokens).

The teacher is the task's (`task.teacher`): the correct answer, with structured mistakes at the
task's forks (for `task=sort`, dropping the rest of a run of repeated values with probability
`policy.sft.fork_error`). Cross-entropy on the teacher's response tokens (its EOS included), AdamW
with a linear warm-up and a cosine decay, fresh teacher data every step, the fp32 teacher-forced
forward of the world.

`measure` reports what the warm start looks like from the policy's own samples: accuracy (mean
reward), the fractions of sampled tokens drawn with p > 0.9 and with p < 0.1, the mean entropy, and the
fraction of fork tokens (entropy above FORK_ENTROPY nats).

The checkpoint is cached by a hash of everything that determines it (the model's shape, the task,
the SFT settings, the device type, torch's version and CACHE_VERSION), in
`policy.sft.cache_dir` (default `$XDG_CACHE_HOME/is-study`, else `~/.cache/is-study`):

    <cache_dir>/transformer-sft/<hash>.pt     params + measurements + the config that made them
    <cache_dir>/transformer-sft/<hash>.json   the same measurements and config, for a reader
    <cache_dir>/transformer-sft/<hash>.lock   the file lock

Parallel jobs that need the same checkpoint take the lock; the first trains, the others wait and
load what it wrote. The checkpoint is written to a temporary file in the same folder and renamed
into place (atomic), so a killed SFT leaves no checkpoint at all, never half of one; its temporary
file is removed by the next run that takes the lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from runner.config_checks import as_float, as_int, check_keys
from runner.errors import UserError
from runner.worlds.precision import FP32, Precision
from runner.worlds.protocol import World  # the transformer world, typed by its protocol (no import circle)
from runner.worlds.transformer.model import init_params

CACHE_VERSION = 1  # bump when the model, the teacher or the training loop changes what SFT produces
FORK_ENTROPY = 0.3  # nats: a token whose next-token distribution is at least this spread is a fork
CONFIDENT = 0.9  # a token drawn with probability above this is a confident one
LOW_PROBABILITY = 0.1  # and below this, a "forking token" (the field's count of them)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = 1000  # 0: no warm start (θ₀ is the random initialisation)
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100
    fork_error: float = 0.1  # the teacher's mistake probability at each fork
    seed: int = 0  # SFT's own seed: every run of the same world shares one warm start
    eval_samples: int = 512  # responses sampled to measure the warm start
    cache_dir: str | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> SFTConfig:
        s = "policy.sft"
        cfg = dict(cfg)
        check_keys(s, cfg, [f.name for f in dataclasses.fields(cls)])
        cache_dir = cfg.get("cache_dir")
        if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir):
            raise UserError(f"policy.sft.cache_dir must be a path or null, got {cache_dir!r}")
        d = cls()
        return cls(
            steps=as_int(s, cfg, "steps", low=0, default=d.steps),
            batch_size=as_int(s, cfg, "batch_size", low=1, default=d.batch_size),
            lr=as_float(s, cfg, "lr", low=0.0, low_open=True, default=d.lr),
            warmup=as_int(s, cfg, "warmup", low=0, default=d.warmup),
            fork_error=as_float(s, cfg, "fork_error", low=0.0, high=1.0, default=d.fork_error),
            seed=as_int(s, cfg, "seed", low=0, default=d.seed),
            eval_samples=as_int(s, cfg, "eval_samples", low=1, default=d.eval_samples),
            cache_dir=cache_dir,
        )


# ------------------------------------------------------------------------------------ the cache
def cache_root(cfg: SFTConfig) -> Path:
    if cfg.cache_dir is not None:
        return Path(cfg.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "is-study"


def cache_identity(world: World, device: torch.device) -> dict[str, Any]:
    """Everything that determines the checkpoint (the cache folder and eval size excepted)."""
    task = world.task
    sft = dataclasses.asdict(world.sft)
    sft.pop("cache_dir")
    return {
        "version": CACHE_VERSION,
        "torch": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
        "device": torch.device(device).type,
        "shape": dataclasses.asdict(world.shape),
        "init_std": world.init_std,
        "task": task.identity(),
        "seq_len": world.seq_len,
        "sft": sft,
    }


def cache_key(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def warm_start(world: World, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(θ₀ on `device`, the warm start's record for summary.json): loaded from the cache, or
    trained now under the lock and cached."""
    from filelock import FileLock

    identity = cache_identity(world, device)
    key = cache_key(identity)
    folder = cache_root(world.sft) / "transformer-sft"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"policy.sft.cache_dir: cannot create {folder}: {exc.strerror}") from None
    path = folder / f"{key}.pt"
    loaded = _load(path, device)
    if loaded is None:
        with FileLock(str(folder / f"{key}.lock")):
            loaded = _load(path, device)  # another job may have trained it while we waited
            if loaded is None:
                for stale in folder.glob(f".{key}.*.tmp"):  # left by a run killed while writing
                    stale.unlink(missing_ok=True)
                loaded = _train_and_save(world, device, identity, path)
                loaded[1]["cache"] = "trained"
    record = dict(loaded[1])
    record.setdefault("cache", "hit")
    record["checkpoint"] = str(path)
    return loaded[0], record


def _load(path: Path, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    if not path.is_file():
        return None
    blob = torch.load(path, map_location=device, weights_only=True)
    return blob["params"], dict(blob["record"])


def _train_and_save(
    world: World, device: torch.device, identity: Mapping[str, Any], path: Path
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    start, cpu_start = time.perf_counter(), time.process_time()
    params = train(world, device)
    # CPU time beside wall time: on a shared machine the wall time measures the neighbours too
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    record = {
        "sft_seconds": round(seconds, 2),
        "sft_cpu_seconds": round(cpu_seconds, 2),
        "sft_steps": world.sft.steps,
        **measure(world, params),
    }
    blob = {"params": {k: v.detach().cpu() for k, v in params.items()}, "record": record, "identity": dict(identity)}
    _atomic_write(path, lambda f: torch.save(blob, f))
    sidecar = {"record": record, "identity": dict(identity)}
    _atomic_write(path.with_suffix(".json"), lambda f: f.write(json.dumps(sidecar, indent=2).encode()))
    return {k: v.detach() for k, v in params.items()}, record


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------- training
def train(world: World, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """SFT from the random initialisation; returns the trained fp32 params (detached)."""
    cfg, task = world.sft, world.task
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    params = {k: v.requires_grad_(True) for k, v in init_params(world.shape, gen, world.init_std).items()}
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    with _progress(cfg.steps) as advance:
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = _lr(cfg, step)
            prompts = task.sample_prompts(cfg.batch_size, gen)  # [B, P]
            tokens, mask = task.teacher(prompts, gen, cfg.fork_error, world.seq_len)  # [B, T] each
            logits = world.logits(params, prompts, tokens, FP32)  # [B, T, V]
            nll = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="none")  # [B·T]
            loss = (nll * mask.flatten()).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            opt.step()
            advance(loss.item() if step % 50 == 0 else None)
    return {k: v.detach() for k, v in params.items()}


def _lr(cfg: SFTConfig, step: int) -> float:
    """Linear warm-up, then a cosine decay to 0 at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * frac))


class _progress:
    """A rich progress bar on stderr when it is a terminal; nothing otherwise."""

    def __init__(self, total: int):
        self.total = total
        self.bar = None

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("SFT warm start"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[loss]}"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("sft", total=self.total, loss="")
        return self.advance

    def advance(self, loss: float | None) -> None:
        if self.bar is not None:
            fields = {"loss": f"loss {loss:.3f}"} if loss is not None else {}
            self.bar.update(self.task, advance=1, **fields)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


# ---------------------------------------------------------------------------------- measurement
@torch.no_grad()
def sample(
    world: World,
    params: dict[str, torch.Tensor],
    prompts: torch.Tensor,
    generator: torch.Generator,
    precision: Precision = FP32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A minimal engine: (tokens [N, T], mask [N, T], the sampler's log-probs of them [N, T] in
    fp32, 0 at padding), sampling at temperature 1 with the cached sampler in `precision`. The
    log-softmax runs in the compute dtype. After the first EOS, tokens are EOS with mask 0."""
    sampler = world.sampler(params, prompts, precision)
    n, T, eos = prompts.shape[0], world.seq_len, world.eos_token
    device = params["wte"].device
    tokens = torch.empty(n, T, dtype=torch.long, device=device)
    logp = torch.empty(n, T, dtype=torch.float32, device=device)
    logits = sampler.start()
    for t in range(T):
        lp = torch.log_softmax(logits, dim=-1)  # [N, V] in the compute dtype
        tok = torch.multinomial(lp.float().exp(), 1, generator=generator).squeeze(-1)  # [N]
        tokens[:, t], logp[:, t] = tok, lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).float()
        if t < T - 1:
            logits = sampler.step(tok)
    is_eos = (tokens == eos).long()
    ended_before = (is_eos.cumsum(-1) - is_eos) > 0
    mask = (~ended_before).float()
    return tokens.masked_fill(ended_before, eos), mask, logp * mask


@torch.no_grad()
def measure(
    world: World, params: dict[str, torch.Tensor], n: int | None = None, seed: int | None = None
) -> dict[str, float]:
    """The warm start's accuracy and entropy profile, from n fp32 samples on held-out prompts
    (their own seed, apart from SFT's data)."""
    n = n or world.sft.eval_samples
    device = params["wte"].device
    gen = torch.Generator(device=device).manual_seed((world.sft.seed if seed is None else seed) + 1_000_003)
    prompts = world.sample_prompts(n, gen)
    tokens, mask, _ = sample(world, params, prompts, gen)
    reward = world.task.reward(prompts, tokens, mask)  # [n]
    stats = world.token_stats(params, prompts, tokens)
    on = mask > 0
    p_tok = stats.logp.exp()[on]
    entropy = stats.entropy[on]
    return {
        "accuracy": round(reward.mean().item(), 4),
        "accuracy_se": round(reward.std().item() / math.sqrt(n), 4),
        "confident_fraction": round((p_tok > CONFIDENT).float().mean().item(), 4),
        "low_probability_fraction": round((p_tok < LOW_PROBABILITY).float().mean().item(), 4),
        "mean_entropy": round(entropy.mean().item(), 4),
        "fork_fraction": round((entropy > FORK_ENTROPY).float().mean().item(), 4),
        "mean_response_len": round(mask.sum(1).mean().item(), 2),
        "eval_samples": n,
    }
