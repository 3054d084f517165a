"""The released framework code `is-study audit` is pointed at: one command per target, and what
each one finds. The README's "Auditing your framework's loss" shows these commands, and
tests/test_audit_released.py runs them on the wheels downloaded from PyPI.

    python examples/audit/released.py [WHEELS]     # download, unpack, audit all (default: wheels/)

The wheels are fetched with `pip download --no-deps` (nothing is installed) and their packages
unpacked into WHEELS/site: only openrlhf/, verl/, trl/ and areal/, since verl's wheel also ships top-level
`tests` and `scripts` packages. OpenRLHF at commit bc71bb19 is not on PyPI; its targets are the
adapter examples/audit/openrlhf_bc71bb1.py (see its docstring for what that does and does not show).

Frameworks with no release on PyPI at the audited version are fetched from their repository at a named
commit (CHECKOUTS: `git fetch --depth 1` of that commit, nothing installed), their package folder put into
WHEELS/site beside the wheels' ones; CHECKOUT_TARGETS audit them through the adapters in this folder.
A folder holding a checkout already can be given instead (the variable each checkout names).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("openrlhf==0.11.2", "verl==0.9.1", "trl==1.16.0", "areal==1.0.4")
UNPACKED = ("openrlhf", "verl", "trl", "areal")
REPO = Path(__file__).resolve().parents[2]
SITE = "{site}"  # in TARGETS' arguments: the folder the wheels' packages are unpacked into

VERL_PPO = f"{SITE}/verl/trainer/ppo"
VERL_CONFIG = (
    '{"loss_agg_mode": "token-mean", "config": {"_target_": "verl.workers.config.ActorConfig", '
    '"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1}}'
)
BC71BB1 = (
    '{"enable_vllm_is_correction": true, "vllm_is_truncated_threshold": [0.5, 5.0], "vllm_is_correction_type": "%s"}'
)


@dataclass(frozen=True)
class Target:
    name: str
    what: str
    args: tuple[str, ...]  # `is-study audit` arguments
    known: tuple[str, ...]  # the known bugs: "CHECK: start of the finding's text"
    other: tuple[str, ...] = ()  # further findings, each true only of adversarial input
    maybe: tuple[str, ...] = ()  # findings a search may or may not reach, on either profile (not bugs)

    def argv(self, site: str | Path) -> list[str]:
        return [a.replace(SITE, str(site)) for a in self.args]

    def command(self, site: str | Path = "wheels/site") -> str:
        return shlex.join(["is-study", "audit", *self.argv(site)])


def adapter_args(adapter: str, package: str, config: dict, reference: str | None = None) -> tuple[str, ...]:
    """`is-study audit` arguments for an adapter in examples/audit/ on the site's PACKAGE with `config`, compared
    with `correction=REFERENCE` on every batch when a preset reproduces that mode."""
    kwargs = json.dumps({package: f"{SITE}/{package}", **config})
    return (
        "--target",
        adapter,
        "--target-kwargs",
        kwargs,
        *(("--reference", f"correction={reference}") if reference else ()),
    )


TARGETS = (
    Target(
        "openrlhf-0.11.2",
        "OpenRLHF 0.11.2 PolicyLoss, sequence-level mask mode",
        (
            "--target",
            f"{SITE}/openrlhf/models/loss.py:PolicyLoss",
            "--stub",
            "deepspeed",
            "--target-kwargs",
            '{"is_correction_level": "seq", "is_correction_mode": "mask"}',
        ),
        known=("1 finite: loss -inf on finite inputs",),
        other=("4 padding: padding values leak: loss nan",),
    ),
    Target(
        "verl-0.9.1",
        "verl 0.9.1 vanilla PPO loss fed by its token IcePop weights",
        # verl's packages import these at module level (orjson: verl/utils/tracking.py); the loss
        # and the weights function call none of them, and is-study depends on none of them
        (
            "--convention",
            "verl",
            "--stub",
            "tensordict,transformers,ray,codetiming,orjson",
            "--target",
            f"{VERL_PPO}/core_algos.py:compute_policy_loss_vanilla",
            "--call-kwargs",
            VERL_CONFIG,
            "--weights-fn",
            f"{VERL_PPO}/rollout_corr_helper.py:compute_rollout_correction_weights",
            "--weights-kwargs",
            '{"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}',
            "--band",
            "0.5,5",
            "--allow-raise",
            "ValueError",
        ),
        known=("raises: ZeroDivisionError: float division by zero at verl/trainer/ppo/rollout_corr_helper.py:758",),
        other=("4 padding: padding values leak: grad",),
    ),
    Target(
        "trl-1.16.0",
        "TRL 1.16.0 GRPO loss with its vLLM IS correction (GRPOConfig defaults)",
        (
            "--convention",
            "trl",
            "--target",
            "examples/audit/trl_grpo.py:GRPOLoss",
            "--target-kwargs",
            f'{{"trl": "{SITE}/trl"}}',
        ),
        known=(),
        other=("1 finite: grad", "4 padding: padding values leak: loss nan"),
    ),
    Target(
        "openrlhf-bc71bb1-seq-mask-tis",
        "OpenRLHF bc71bb19 seq-mask-tis (adapter)",
        (
            "--target",
            "examples/audit/openrlhf_bc71bb1.py:PolicyLoss",
            "--target-kwargs",
            BC71BB1 % "seq-mask-tis",
            "--reference",
            "correction=seq-mask-tis",
        ),
        known=(
            "1 finite: loss -inf on finite inputs",
            "2 reject→0: rejected unit[0][0]",
            "reference: vs correction=seq-mask-tis: token[0][0] gets weight 10",
        ),
        other=("4 padding: padding values leak: loss nan",),
    ),
    Target(
        "openrlhf-bc71bb1-icepop",
        "OpenRLHF bc71bb19 icepop (adapter)",
        ("--target", "examples/audit/openrlhf_bc71bb1.py:PolicyLoss", "--target-kwargs", BC71BB1 % "icepop"),
        known=("1 finite: loss nan on finite inputs", "2 reject→0: rejected unit[0][0]"),
        other=("4 padding: padding values leak: loss nan",),
    ),
)


@dataclass(frozen=True)
class Checkout:
    """A framework's repository at one commit, of which only `package` is used."""

    name: str
    url: str
    commit: str
    package: str  # the folder copied into the site
    env: str  # a variable naming a local checkout to use instead of fetching
    within: str = ""  # the folder of the repository that holds `package` (prime-rl's src/)
    # When given, these paths of the repository are copied into site/PACKAGE with the repository's layout,
    # instead of the folder PACKAGE itself (slime: its package and the MIS helper under examples/).
    paths: tuple[str, ...] = ()

    def fetch(self, site: Path) -> Path:
        """site/PACKAGE from the checkout in $ENV, or fetched from `url` at `commit`."""
        dest = site / self.package
        if dest.is_dir():
            return dest
        local = os.environ.get(self.env)
        if local:
            for path in self.paths or (str(Path(self.within) / self.package),):
                if not (Path(local) / path).is_dir():
                    raise FileNotFoundError(f"${self.env}={local} has no {path}/ folder")
            self._copy(Path(local), dest)
            return dest
        with tempfile.TemporaryDirectory() as tmp:
            git = ["git", "-C", tmp]
            subprocess.run([*git, "init", "--quiet"], check=True)
            subprocess.run([*git, "fetch", "--quiet", "--depth", "1", self.url, self.commit], check=True, timeout=600)
            subprocess.run([*git, "checkout", "--quiet", "FETCH_HEAD"], check=True)
            self._copy(Path(tmp), dest)
        return dest

    def _copy(self, root: Path, dest: Path) -> None:
        if not self.paths:
            shutil.copytree(root / self.within / self.package, dest)
        for path in self.paths:
            shutil.copytree(root / path, dest / path)


NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"  # no PyPI release
SKYRL_COMMIT = "a9564572eb8e91076be43c1bd5e4615e3de17265"  # PyPI's skyrl 0.3.0 predates its off_policy_correction
ROLL_COMMIT = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"  # not on PyPI
PRIME_RL_COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"  # PyPI's prime-rl does not ship this trainer
CHECKOUTS = (
    Checkout("nemo-rl", "https://github.com/NVIDIA-NeMo/RL", NEMO_RL_COMMIT, "nemo_rl", "IS_STUDY_NEMO_RL"),
    Checkout("skyrl", "https://github.com/NovaSky-AI/SkyRL", SKYRL_COMMIT, "skyrl", "IS_STUDY_SKYRL"),
    Checkout("roll", "https://github.com/alibaba/ROLL", ROLL_COMMIT, "roll", "IS_STUDY_ROLL"),
    Checkout(
        "prime-rl",
        "https://github.com/PrimeIntellect-ai/prime-rl",
        PRIME_RL_COMMIT,
        "prime_rl",
        "IS_STUDY_PRIME_RL",
        "src",
    ),
    Checkout(
        "slime",
        "https://github.com/THUDM/slime",
        SLIME_COMMIT,
        "slime",
        "IS_STUDY_SLIME",
        paths=("slime", "examples/train_infer_mismatch_helper"),
    ),
)
# An adversarial finding of every NeMo-RL mode: finite padding with lp − old = 1e4 overflows PPO's ratio
# (exp, unclamped) to inf there, and the backward of exp multiplies the 0 gradient by it: NaN.
NEMO_RL_OTHER = (
    "1 finite: grad[0][1] (a masked position) nan on finite inputs",
    "4 padding: padding values leak: loss nan",
)
CHECKOUT_TARGETS = tuple(
    Target(
        f"nemo-rl-{mode}",
        f"NeMo-RL {NEMO_RL_COMMIT[:8]} ClippedPGLossFn, truncated_importance_sampling_type={mode} (adapter)",
        (
            "--target",
            "examples/audit/nemo_rl.py:ClippedPGLoss",
            "--target-kwargs",
            json.dumps({"nemo_rl": f"{SITE}/nemo_rl", "truncated_importance_sampling_type": mode}),
            "--reference",
            f"correction=nemo-rl/{mode}",
        ),
        known=(),
        other=NEMO_RL_OTHER,
    )
    for mode in ("tis", "icepop", "seq-mask-tis")
)
# SkyRL's `regular` loss with one off-policy correction each, two in SkyRL's order (token mask, then sequence TIS
# or the geometric mask over the tokens it kept), and the stack its docs recommend (geometric sequence mask,
# token TIS, token mask, outlier mask: the order of operations matters); each mode with a preset is compared
# with it on every batch (SKYRL_REFERENCES). Its finding: NaN padding reaches the loss (loss · mask, summed). The
# hypothesis search sometimes also finds a gradient 2e-4 away from float64 finite differences, on either
# profile: safe_exp_delta computes PPO's ratio in float32 whatever the input dtype (deliberate, no bug).
SKYRL_STACK = {
    "sequence_mask_metric": "geometric",
    "tis_ratio_type": "token",
    "token_mask_is_threshold_low": 0.5,
    "token_mask_is_threshold_high": 2.0,
    "outlier_token_is_threshold_low": 1e-4,
    "outlier_token_is_threshold_high": 100,
}
SKYRL_TOKEN_MASK = {"token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 2.0}
SKYRL_MODES = (
    ("tis-token", {"tis_ratio_type": "token"}),
    ("sequence-mask-geometric", {"sequence_mask_metric": "geometric"}),
    ("recommended", SKYRL_STACK),
    ("sequence-mask-product", {"sequence_mask_metric": "product"}),
    ("outlier-token-is", {"outlier_token_is_threshold_low": 1e-4, "outlier_token_is_threshold_high": 100.0}),
    ("tis-sequence-token-mask-is", {"tis_ratio_type": "sequence", **SKYRL_TOKEN_MASK}),
    ("geometric-token-mask-is", {"sequence_mask_metric": "geometric", **SKYRL_TOKEN_MASK}),
)
SKYRL_REFERENCES = {
    "tis-token": "skyrl/tis-token",
    "sequence-mask-geometric": "skyrl/geometric",
    "sequence-mask-product": "skyrl/product",
    "outlier-token-is": "skyrl/outlier-token-is",
    "tis-sequence-token-mask-is": "skyrl/tis-sequence-token-mask-is",
    "geometric-token-mask-is": "skyrl/geometric-token-mask-is",
}
CHECKOUT_TARGETS += tuple(
    Target(
        f"skyrl-{name}",
        f"SkyRL {SKYRL_COMMIT[:8]} ppo_policy_loss, off_policy_correction {name} (adapter)",
        adapter_args("examples/audit/skyrl.py:PPOPolicyLoss", "skyrl", config, SKYRL_REFERENCES.get(name)),
        known=(),
        other=("4 padding: padding values leak: loss nan",),
        maybe=("7 grad=FD: directional derivative",),
    )
    for name, config in SKYRL_MODES
)

# slime's policy loss with --use-tis (vanilla_tis_function), icepop_function, and the MIS helper as mis.yaml ships
# it, each compared with its preset on every batch. Its adversarial findings are the loss's, not the
# correction's: PPO's ratio exp(lp − old) is unbounded (finite padding with lp − old = 1e4 gives inf, 0·inf in
# the backward), the reducer multiplies by the mask (NaN padding reaches the loss), and a sample whose tokens
# are all masked still counts in the mean over the batch's samples (deliberate: slime's remove_sample).
SLIME_OTHER = (
    "1 finite: grad[0][1] (a masked position) nan on finite inputs",
    "4 padding: padding values leak: loss nan",
    "5 on-policy: on-policy differs from none",
)
SLIME_MODES = (
    ("tis", {"use_tis": True}),
    ("icepop", {"use_tis": True, "tis_function": "icepop", "tis_clip_low": 0.5}),
    ("mis-batch-normalize", {"use_tis": True, "tis_function": "mis"}),
)
CHECKOUT_TARGETS += tuple(
    Target(
        f"slime-{name}",
        f"slime {SLIME_COMMIT[:8]} policy loss, {name} (adapter)",
        adapter_args("examples/audit/slime.py:PolicyLoss", "slime", config, f"slime/{name}"),
        known=(),
        other=SLIME_OTHER,
    )
    for name, config in SLIME_MODES
)


# ROLL's RLVR actor loss with one train_infer_correction each, compared with its preset on every batch. The two
# adversarial findings are of its PPO ratio exp(lp − old), unbounded, at a masked position (finite padding with
# lp − old = 1e4: 0·inf in the backward; NaN padding: NaN through the mask product). Under loss_agg_mode=token-mean
# ROLL's agg_loss does not multiply by the mask, so its filters and its padding reach the loss: a bug on ordinary
# inputs (the reference check), docs/audit.md.
ROLL_ADVERSARIAL = (
    "1 finite: grad[0][1] (a masked position) nan on finite inputs",
    "4 padding: padding values leak: grad[0][0] nan",
)
ROLL_MODES = (
    ("is-token", {"is_weight": {"enabled": True, "weight_type": "token"}}),
    ("filter-token", {"filters": [{"enabled": True, "agg_type": "token"}]}),
    (
        "ratio-diff-segment",
        {
            "filters": [
                {
                    "enabled": True,
                    "agg_type": "segment",
                    "ratio_high": 1.05,
                    "diff_enabled": True,
                    "diff_low": -0.1,
                    "diff_high": 0.1,
                }
            ]
        },
    ),
)
CHECKOUT_TARGETS += tuple(
    Target(
        f"roll-{name}",
        f"ROLL {ROLL_COMMIT[:8]} ActorWorker.loss_func, train_infer_correction {name} (adapter)",
        adapter_args("examples/audit/roll.py:ActorLoss", "roll", config, f"roll/{name}"),
        known=(),
        other=ROLL_ADVERSARIAL,
    )
    for name, config in ROLL_MODES
)
CHECKOUT_TARGETS += (
    Target(
        "roll-filter-token-token-mean",
        f"ROLL {ROLL_COMMIT[:8]} ActorWorker.loss_func, a token filter under loss_agg_mode=token-mean (adapter)",
        (
            "--target",
            "examples/audit/roll.py:ActorLoss",
            "--target-kwargs",
            json.dumps({"roll": f"{SITE}/roll", "loss_agg_mode": "token-mean", **ROLL_MODES[1][1]}),
            "--reference",
            "correction=roll/filter-token",
        ),
        known=("4 padding: padding values leak: loss", "5 on-policy:", "reference:"),
        other=("1 finite: grad[0][1] (a masked position) nan on finite inputs",),
    ),
)
# prime-rl's rl loss, default (DPPO Binary-TV + KL) and IPO. Its ratio exp(trainer − inference) is unbounded: a
# token the engine gave log-prob −100 overflows it, and the trust-region mask drops the token by multiplying,
# 0·inf = NaN, a realistic finding; the same product at a masked position (loss_mask · …) leaks NaN padding and
# makes an all-masked batch NaN (adversarial).
CHECKOUT_TARGETS += tuple(
    Target(
        f"prime-rl-{kind}",
        f"prime-rl {PRIME_RL_COMMIT[:8]} compute_loss with {kind} loss (adapter)",
        (
            "--target",
            "examples/audit/prime_rl.py:RLLoss",
            "--target-kwargs",
            json.dumps({"prime_rl": f"{SITE}/prime_rl", "type": kind}),
        ),
        known=("1 finite: loss nan on finite inputs",),
        other=("4 padding: padding values leak: loss nan", "all-masked: all-masked batch gives loss nan"),
    )
    for kind in ("default", "ipo")
)

# AReaL's rejection sampling, one target per (level, action), each compared with our preset on every batch.
# Both findings are of its PPO ratio exp(lp − proximal), unbounded, at a masked position: finite padding with
# lp − old = 1e4 gives inf there (0·inf in the backward), NaN padding a NaN gradient through torch.where.
AREAL_OTHER = (
    "1 finite: grad[0][1] (a masked position) nan on finite inputs",
    "4 padding: padding values leak: grad[0][0] nan",
)
AREAL_TARGETS = tuple(
    Target(
        f"areal-1.0.4-{level}-{action}",
        f"AReaL 1.0.4 ppo_actor_loss_fn, rejection_sampling level={level} action={action} (adapter)",
        (
            "--target",
            "examples/audit/areal.py:PPOActorLoss",
            "--target-kwargs",
            json.dumps({"areal": f"{SITE}/areal", "level": level, "action": action}),
            "--reference",
            f"correction=areal/{level}-{action}",
        ),
        known=(),
        other=AREAL_OTHER,
    )
    for level, action in (("token", "mask"), ("token", "clamp"), ("sequence", "mask"))
)
# AReaL's other modes (its KL metrics, agg=max, M2PO without rejection sampling), each with its preset: the same
# two findings, of the same PPO ratio.
AREAL_MODES = (
    *(
        (f"token-mask-kl_{k}", {"level": "token", "action": "mask", "metric": f"kl_{k}", "upper": 2.0})
        for k in ("k1", "k2", "k3")
    ),
    ("sequence-mask-kl_k3", {"level": "sequence", "action": "mask", "metric": "kl_k3", "agg": "mean", "upper": 2.0}),
    ("sequence-mask-max", {"level": "sequence", "action": "mask", "metric": "ratio", "agg": "max"}),
    ("m2po", {"rejection_sampling": False, "m2_threshold": 0.04}),
)
AREAL_TARGETS += tuple(
    Target(
        f"areal-1.0.4-{name}",
        f"AReaL 1.0.4 ppo_actor_loss_fn, {name} (adapter)",
        adapter_args("examples/audit/areal.py:PPOActorLoss", "areal", config, f"areal/{name}"),
        known=(),
        other=AREAL_OTHER,
        # M2PO masks over the whole batch, and of tied lr_t² it masks the one torch.sort puts first, so permuting
        # the rows can move the mask from one sequence to another (case m2-tie of conf/cases/areal.yaml): AReaL's
        # own behaviour, which a search reaches on some hypothesis versions (6.170) and not others (6.155)
        maybe=("6 permute: rows permuted",) if name == "m2po" else (),
    )
    for name, config in AREAL_MODES
)
TARGETS = (*TARGETS, *AREAL_TARGETS)
# verl's rejection sampling and self-normalised IS weights, and TRL's off-policy sequence mask, each through
# an adapter that runs the released functions. verl's token-mean divides by the surviving tokens: a batch
# its rejection empties gives 0/0 = NaN (the finding below; is-study's reductions give 0 there).
VERL_STUBS = "tensordict,transformers,ray,codetiming,orjson"
VERL_ROLLOUT_CORR = "examples/audit/verl_rollout_corr.py:RolloutCorrectedLoss"
MODE_TARGETS = (
    Target(
        "verl-0.9.1-seq-max-k2",
        "verl 0.9.1 vanilla PPO loss behind its seq_max_k2 rejection, threshold 0.5 (adapter)",
        (
            "--stub",
            VERL_STUBS,
            "--target",
            VERL_ROLLOUT_CORR,
            "--target-kwargs",
            json.dumps({"verl": f"{SITE}/verl", "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.5}),
            "--allow-raise",
            "ValueError",
        ),
        known=("1 finite: loss nan on finite inputs",),
        other=("4 padding: padding values leak: grad",),
    ),
    Target(
        "verl-0.9.1-token-tis-batch-norm",
        "verl 0.9.1 vanilla PPO loss with batch-normalised token TIS weights (adapter)",
        (
            "--stub",
            VERL_STUBS,
            "--target",
            VERL_ROLLOUT_CORR,
            "--target-kwargs",
            json.dumps(
                {
                    "verl": f"{SITE}/verl",
                    "rollout_is": "token",
                    "rollout_is_threshold": 2.0,
                    "rollout_is_batch_normalize": True,
                }
            ),
            "--allow-raise",
            "ValueError",
        ),
        known=(),
        other=("4 padding: padding values leak: grad",),
    ),
    Target(
        "trl-1.16.0-off-policy-mask",
        "TRL 1.16.0 GRPO loss with off_policy_mask_threshold=0.5 over its vLLM IS correction",
        (
            "--convention",
            "trl",
            "--target",
            "examples/audit/trl_grpo.py:GRPOLoss",
            "--target-kwargs",
            json.dumps({"trl": f"{SITE}/trl", "off_policy_mask_threshold": 0.5}),
        ),
        known=(),
        other=("1 finite: grad", "4 padding: padding values leak: loss nan"),
    ),
)
TARGETS = (*TARGETS, *MODE_TARGETS)


def download(wheels: Path) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), *PACKAGES], check=True
    )


def unpack(wheels: Path) -> Path:
    """The packages of every wheel in `wheels` into wheels/site (a wheel is a zip; nothing runs)."""
    site = wheels / "site"
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                parts = member.split("/")
                if len(parts) > 2 and parts[0].endswith(".data") and parts[1] in ("purelib", "platlib"):
                    parts = parts[2:]
                if parts[0] not in UNPACKED or member.endswith("/"):
                    continue
                dest = site.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(member))
    return site


def main(argv: list[str]) -> int:
    wheels = Path(argv[0] if argv else "wheels").resolve()
    if not list(wheels.glob("*.whl")):
        download(wheels)
    site = unpack(wheels)
    for checkout in CHECKOUTS:
        checkout.fetch(site)
    for target in (*TARGETS, *CHECKOUT_TARGETS):
        print(f"\n## {target.name}: {target.what}\n$ {target.command(site)}", flush=True)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "runner", "audit", "--out", str(wheels / "audit-cases"), *target.argv(site)],
            cwd=REPO,
        )
        print(f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
