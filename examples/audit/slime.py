"""slime's policy loss with its off-policy corrections, callable by `is-study audit` and `is-study case --target`.

slime is not on PyPI; it is read from the repository at a commit (COMMIT). Its loss module imports Megatron at
module level and computes log-probs from logits, so this adapter compiles, *from the checkout you point it
at*, only what one micro-batch's policy loss runs: `loss_function`, `policy_loss_function`,
`vanilla_tis_function` and `icepop_function` of slime/backends/megatron_utils/loss.py, `compute_policy_loss`,
`compute_cispo_loss` and `compute_opsm_mask` of slime/utils/ppo_utils.py, `get_sum_of_sample_mean`,
`all_gather_with_cp` and `slice_log_prob_with_cp` of slime/backends/megatron_utils/cp_utils.py, and every
function of examples/train_infer_mismatch_helper/mis.py (the MIS helper), keeping their file names and line
numbers. Nothing of slime is copied here.

    git clone https://github.com/THUDM/slime slime && git -C slime checkout 624b824a
    is-study audit --target examples/audit/slime.py:PolicyLoss \\
        --target-kwargs '{"slime": "slime", "use_tis": true, "tis_function": "mis", "tis_mode": "mask"}'

`slime` is the repository's root folder. The other kwargs are slime's arguments (slime/utils/arguments.py and
the MIS helper's mis.yaml), their defaults where not given; `tis_function` picks `--custom-tis-function-path`:
"vanilla" (none: vanilla_tis_function), "icepop" (loss.py's icepop_function) or "mis" (mis.py's
compute_mis_weights_with_cp).

What is not slime's own code, and why: the stand-ins for one process without Megatron (context-parallel and
data-parallel sizes 1, so the CP gather and slice return their input, as their own `cp_size == 1` branches do);
the log-probs come in as tensors instead of being computed from logits (get_log_probs_and_entropy is replaced
by one that returns them, entropy 0 with entropy_coef 0); `@torch.compile` is dropped from the two losses it
decorates (a compiler for speed, needing a C toolchain on CPU). Each row of the batch is one sample of its
own rollout (slime's default, no rollout_id: each sample's denominator is its own mask's token count), the
micro-batch is the step's whole batch, and a masked position is a loss_mask 0 token inside the response (a
tool's output in a multi-turn sample), not padding slime would cut away.
"""

from __future__ import annotations

import ast
import sys
import types
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from compiled_source import definitions

COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
# slime/utils/arguments.py at COMMIT, and examples/train_infer_mismatch_helper/mis.yaml for the helper's keys
DEFAULTS = {
    "advantage_estimator": "grpo",
    "eps_clip": 0.2,
    "eps_clip_high": None,  # set to eps_clip when not given (arguments.py's slime_validate_args)
    "eps_clip_c": None,
    "use_tis": False,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "use_opsm": False,
    "opsm_delta": 1e-4,
    # the MIS helper (mis.yaml's values)
    "use_rs": True,
    "tis_level": "token",
    "rs_level": "token",
    "tis_mode": "truncate",
    "tis_lower_bound": 0.5,
    "tis_upper_bound": 2.0,
    "rs_lower_bound": None,
    "rs_upper_bound": None,
    "rs_veto_threshold": 1e-4,
    "tis_batch_normalize": True,
}
# --custom-tis-function-path: none (vanilla_tis_function), loss.py's icepop_function, the MIS helper
TIS_FUNCTIONS = ("vanilla", "icepop", "mis")
MIS_PATH = Path("examples") / "train_infer_mismatch_helper" / "mis.py"


def _compile(ns: dict[str, Any], path: Path, names: set[str]) -> None:
    module = definitions(path, names)
    for node in module.body:
        node.decorator_list = []  # @torch.compile only
    exec(compile(module, str(path), "exec", dont_inherit=True), ns)


def load(slime: str | Path) -> dict[str, Any]:
    """loss_function and what it calls, compiled from the checkout's root folder."""
    root = Path(slime)
    megatron_utils = root / "slime" / "backends" / "megatron_utils"
    if not (megatron_utils / "loss.py").is_file():
        raise FileNotFoundError(f"{megatron_utils / 'loss.py'} not found: `slime` must be the repository's root")
    mpu = types.SimpleNamespace(
        get_context_parallel_world_size=lambda: 1,
        get_context_parallel_group=lambda: None,
        get_data_parallel_world_size=lambda with_context_parallel=False: 1,
    )
    ns: dict[str, Any] = {"torch": torch, "Any": Any, "Callable": Callable, "Namespace": Namespace, "mpu": mpu}
    _compile(
        ns, megatron_utils / "cp_utils.py", {"get_sum_of_sample_mean", "all_gather_with_cp", "slice_log_prob_with_cp"}
    )
    _compile(
        ns,
        root / "slime" / "utils" / "ppo_utils.py",
        {"compute_policy_loss", "compute_cispo_loss", "compute_opsm_mask"},
    )
    mis: dict[str, Any] = {"torch": torch, "Any": Any}
    _compile(mis, root / MIS_PATH, _function_names(root / MIS_PATH))
    ns["RolloutBatch"] = dict
    ns["get_rollout_top_p_logprob_kwargs"] = lambda args, batch: {}
    ns["_maybe_capture_log_probs"] = lambda batch, log_probs: None
    ns["checkpoint"] = None  # recompute_loss_function is off
    _compile(
        ns,
        megatron_utils / "loss.py",
        {"loss_function", "policy_loss_function", "vanilla_tis_function", "icepop_function"},
    )
    # compute_mis_weights_with_cp imports the CP helpers lazily, from slime's own module path
    cp_module = types.ModuleType("slime.backends.megatron_utils.cp_utils")
    cp_module.all_gather_with_cp = ns["all_gather_with_cp"]
    cp_module.slice_log_prob_with_cp = ns["slice_log_prob_with_cp"]
    ns["_cp_module"] = cp_module
    # --custom-tis-function-path, by the names TIS_FUNCTIONS gives
    custom = {"icepop": ns["icepop_function"], "mis": mis["compute_mis_weights_with_cp"]}
    ns["load_function"] = custom.__getitem__
    return ns


def _function_names(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


class PolicyLoss:
    """(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) → slime's scaled policy loss
    (loss_function's first output, for one micro-batch holding the step's batch on one rank)."""

    def __init__(self, slime: str, tis_function: str = "vanilla", **arguments):
        unknown = sorted(set(arguments) - set(DEFAULTS))
        if unknown:
            raise TypeError(f"unknown slime argument(s): {', '.join(unknown)}")
        if tis_function not in TIS_FUNCTIONS:
            raise TypeError(f"tis_function must be one of {', '.join(TIS_FUNCTIONS)}, got {tis_function!r}")
        self.ns = load(slime)
        settings = {**DEFAULTS, **arguments}
        if settings["eps_clip_high"] is None:
            settings["eps_clip_high"] = settings["eps_clip"]
        self.args = Namespace(
            **settings,
            loss_type="policy_loss",
            recompute_loss_function=False,
            allgather_cp=False,
            calculate_per_token_loss=False,
            use_rollout_logprobs=False,
            get_mismatch_metrics=False,
            custom_tis_function_path=None if tis_function == "vanilla" else tis_function,
            custom_pg_loss_reducer_function_path=None,
            entropy_coef=0.0,
            use_kl_loss=False,
        )

    def __call__(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        batch_size, length = old_log_probs.shape
        mask = torch.ones_like(old_log_probs) if action_mask is None else action_mask.to(old_log_probs.dtype)
        rows = list(log_probs.unbind(0))
        self.ns["get_log_probs_and_entropy"] = lambda logits, **kw: (
            None,
            {"log_probs": rows, "entropy": [torch.zeros_like(r) for r in rows]},
        )
        batch = {
            "advantages": list(advantages.unbind(0)),
            "log_probs": list(old_log_probs.unbind(0)),
            "rollout_log_probs": list(rollout_log_probs.unbind(0)),
            "loss_masks": list(mask.unbind(0)),
            "response_lengths": [length] * batch_size,
            "total_lengths": [length] * batch_size,
            "unconcat_tokens": None,
            "rollout_mask_sums": mask.sum(-1),  # each sample its own rollout
        }
        previous = sys.modules.get(self.ns["_cp_module"].__name__)
        sys.modules[self.ns["_cp_module"].__name__] = self.ns["_cp_module"]
        try:
            loss, _normalizer, _log = self.ns["loss_function"](
                self.args, batch, 1, batch_size, torch.zeros(1, dtype=log_probs.dtype)
            )
        finally:
            if previous is None:
                sys.modules.pop(self.ns["_cp_module"].__name__, None)
            else:
                sys.modules[self.ns["_cp_module"].__name__] = previous
        return loss
