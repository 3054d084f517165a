"""ROLL's actor loss with its train-infer correction, callable by `is-study audit` and `is-study case --target`.

ROLL (github.com/alibaba/ROLL) is not on PyPI, and its workers import Ray, Megatron and the whole pipeline at
module level. This adapter compiles, *from the ROLL checkout you point it at*, only what the RLVR actor's
`loss_func` runs: the class `ActorWorker` of roll/pipeline/rlvr/actor_worker.py (its `loss_func` and
`compute_sample_weights`), `compute_train_infer_correction` and `_compute_all_granularity` of
roll/utils/train_infer_corrections.py, the three config dataclasses of `train_infer_correction` in
roll/configs/base_config.py, `agg_loss`, `masked_mean`, `masked_sum` and `compute_approx_kl` of
roll/utils/functionals.py and `compute_segment_masked_mean` of roll/pipeline/agentic/utils.py, keeping their
file names and line numbers. Nothing of ROLL is copied here.

    git clone https://github.com/alibaba/ROLL roll && git -C roll checkout 8eb27cc2
    is-study audit --target examples/audit/roll.py:ActorLoss \\
        --target-kwargs '{"roll": "roll/roll", "filters": [{"enabled": true, "agg_type": "token"}]}'

`roll` is the folder of the `roll` package. The other kwargs: `is_weight` (TrainInferISWeightConfig's fields),
`filters` (a list of TrainInferFilterConfig's), `loss_agg_mode` (ROLL's default seq-mean-token-mean), and
`pg_clip` (0.2). The worker is called as ROLL's strategy calls it: the log-probs are the model's output, the
batch's token and sample counts (meta_info) are those of the response mask before any filter, as
strategy.py's _get_batch_num_tokens and _get_global_valid_samples count them, with no KL or entropy term.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, Optional, Union

import numpy as np
import torch
from compiled_source import compile_into

COMMIT = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"


def load(roll: str | Path) -> dict[str, Any]:
    """ActorWorker and what its loss_func calls, compiled from the package folder."""
    root = Path(roll)
    if not (root / "utils" / "train_infer_corrections.py").is_file():
        raise FileNotFoundError(f"{root}: `roll` must be the folder of the roll package")
    ns: dict[str, Any] = {
        "torch": torch,
        "np": np,
        "F": torch.nn.functional,
        "Optional": Optional,
        "Dict": dict,
        "Tuple": tuple,
        "List": list,
        "Union": Union,
        "Literal": Literal,
        "dataclass": dataclasses.dataclass,
        "field": dataclasses.field,
        "DataProto": Any,
        "BaseActorWorker": object,
        "logger": SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None),
    }
    compile_into(ns, root / "utils" / "functionals.py", {"agg_loss", "masked_mean", "masked_sum", "compute_approx_kl"})
    compile_into(ns, root / "pipeline" / "agentic" / "utils.py", {"compute_segment_masked_mean"})
    compile_into(
        ns,
        root / "configs" / "base_config.py",
        {"TrainInferISWeightConfig", "TrainInferFilterConfig", "TrainInferCorrectionConfig"},
    )
    ns["RLVRConfig"] = Any
    compile_into(
        ns,
        root / "utils" / "train_infer_corrections.py",
        {"_compute_all_granularity", "compute_train_infer_correction"},
    )
    compile_into(ns, root / "pipeline" / "rlvr" / "actor_worker.py", {"ActorWorker"})
    return ns


class ActorLoss:
    """(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) → ROLL's RLVR actor loss
    (PPO's clipped surrogate, importance_sampling=token) with its train_infer_correction."""

    def __init__(
        self,
        roll: str,
        is_weight: dict | None = None,
        filters: list[dict] | None = None,
        loss_agg_mode: str = "seq-mean-token-mean",
        pg_clip: float = 0.2,
    ):
        ns = load(roll)
        correction = ns["TrainInferCorrectionConfig"](
            is_weight=ns["TrainInferISWeightConfig"](**(is_weight or {})),
            filters=[ns["TrainInferFilterConfig"](**f) for f in (filters or [])],
        )
        self.worker = ns["ActorWorker"]
        self.config = SimpleNamespace(
            train_infer_correction=correction,
            enable_old_logprobs_recompute=False,
            importance_sampling="token",
            pg_clip=pg_clip,
            use_pg_clip_range=False,
            pg_clip_low=pg_clip,
            pg_clip_high=pg_clip,
            dual_clip_loss=False,
            loss_agg_mode=loss_agg_mode,
            use_kl_loss=False,
            kl_loss_coef=0.0,
            rl_loss_coef=1.0,
            entropy_loss_coef=0.0,
            difficulty_loss_weight=False,
            length_loss_weight=False,
        )

    def __call__(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(old_log_probs) if action_mask is None else action_mask
        mask = mask.long()
        # ROLL's response_mask covers the prompt's last token too: loss_func drops its first column
        response_mask = torch.cat([torch.zeros_like(mask[:, :1]), mask], dim=-1)
        tokens = mask.sum()
        samples = torch.any(mask > 0, dim=-1).long().sum()
        data = SimpleNamespace(
            batch={
                "response_mask": response_mask,
                "ref_log_probs": old_log_probs,
                "advantages": advantages,
                "old_log_probs": old_log_probs,
                "infer_logprobs": old_log_probs if rollout_log_probs is None else rollout_log_probs,
                "input_ids": None,
            },
            non_tensor_batch={},
            meta_info={
                "batch_num_tokens": {"response_mask": tokens if tokens > 0 else tokens.new_tensor(1)},
                "global_valid_samples": {"response_mask": samples if samples > 0 else samples.new_tensor(1)},
            },
        )
        worker = SimpleNamespace(
            pipeline_config=self.config,
            strategy=SimpleNamespace(op_compute_log_probs=lambda logits, input_ids, attention_mask: logits),
            get_old_log_probs_with_cache=lambda data, log_probs: data.batch["old_log_probs"],
        )
        worker.compute_sample_weights = lambda data, response_mask: self.worker.compute_sample_weights(
            worker, data, response_mask
        )
        loss, _metrics = self.worker.loss_func(worker, data, log_probs)
        return loss
