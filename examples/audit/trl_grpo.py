"""TRL's GRPO loss with its vLLM importance-sampling correction, callable by `is-study audit`.

TRL has no policy-loss function to import: the IS ratio is computed inline in
`GRPOTrainer._generate_and_score_completions` (next to vLLM generation) and applied in
`GRPOTrainer._compute_loss` (next to the model's forward pass). This adapter compiles exactly those
statements *from the TRL source you point it at* — the `if self.use_vllm and
self.vllm_importance_sampling_correction:` block and the `_compute_loss` method, plus TRL's own
`nanmin`/`nanmax` — keeping their file name and line numbers, so a finding points at TRL's line.
Nothing of TRL is copied here. It runs them with a stand-in trainer that supplies the tensors and
GRPOConfig's settings, on one process with no gradient accumulation.

    is-study audit --convention trl --target examples/audit/trl_grpo.py:GRPOLoss \\
        --target-kwargs '{"trl": "WHEELS/trl"}'

`trl` is the folder of the `trl` package (e.g. a `pip download --no-deps trl==1.16.0` wheel,
unzipped). The other kwargs are GRPOConfig's, with its defaults: loss_type="dapo",
vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_max=3.0,
off_policy_mask_threshold=None (DeepSeek-V3.2's off-policy sequence mask, which `_compute_loss` computes from
the `sampling_per_token_logps` that `_generate_and_score_completions` hands it under vLLM), ...
"""

from __future__ import annotations

import ast
import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

IS_BLOCK_TEST = "self.use_vllm and self.vllm_importance_sampling_correction"
IS_RESULT = "vllm_importance_sampling_ratio"


def _parse(path: Path) -> ast.Module:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: `trl` must be the folder of the trl package")
    return ast.parse(path.read_text(), filename=str(path))


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise LookupError(f"{cls}.{name} not found")


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{name} not found")


def _is_block(method: ast.FunctionDef) -> ast.If:
    """The `if` that turns vLLM's sampling log-probs into the IS ratio."""
    for node in ast.walk(method):
        if (
            isinstance(node, ast.If)
            and ast.unparse(node.test) == IS_BLOCK_TEST
            and any(
                isinstance(t, ast.Name) and t.id == IS_RESULT
                for stmt in ast.walk(node)
                if isinstance(stmt, ast.Assign)
                for t in stmt.targets
            )
        ):
            return node
    raise LookupError(f"the `if {IS_BLOCK_TEST}:` block that computes {IS_RESULT} not found")


def _compile(path: Path, functions: list[ast.FunctionDef], namespace: dict[str, Any]) -> dict[str, Any]:
    module = ast.Module(body=functions, type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, str(path), "exec"), namespace)
    return namespace


def _as_function(name: str, args: list[str], block: ast.If) -> ast.FunctionDef:
    """def name(args): <the block's body>; return vllm_importance_sampling_ratio"""
    ret = ast.Return(value=ast.Name(id=IS_RESULT, ctx=ast.Load()))
    ast.copy_location(ret, block.body[-1])
    fn = ast.FunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg(arg=a) for a in args], kwonlyargs=[], kw_defaults=[], defaults=[]
        ),
        body=[*block.body, ret],
        decorator_list=[],
        returns=None,
        **({"type_params": []} if "type_params" in ast.FunctionDef._fields else {}),
    )
    return ast.copy_location(fn, block)


class _Accelerator:
    """One process, no accumulation: gather and reduce hand back what they get."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


class GRPOLoss:
    """(per_token_logps, old_per_token_logps, sampling_per_token_logps, advantages, completion_mask)
    → TRL's GRPO loss with the vLLM IS correction, as GRPOTrainer computes it."""

    def __init__(
        self,
        trl: str,
        loss_type: str = "dapo",
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        vllm_importance_sampling_mode: str = "sequence_mask",
        vllm_importance_sampling_clip_min: float | None = None,
        vllm_importance_sampling_clip_max: float | None = 3.0,
        importance_sampling_level: str = "token",
        delta: float | None = None,
        off_policy_mask_threshold: float | None = None,
    ):
        root = Path(trl)
        trainer_py, utils_py = root / "trainer" / "grpo_trainer.py", root / "trainer" / "utils.py"
        tree = _parse(trainer_py)
        utils = _compile(
            utils_py, [_function(_parse(utils_py), "nanmin"), _function(_parse(utils_py), "nanmax")], {"torch": torch}
        )
        block = _is_block(_method(tree, "GRPOTrainer", "_generate_and_score_completions"))
        # a @staticmethod in TRL: compiled as the plain function it is, and set on the stand-in trainer
        off_policy_mask = _method(tree, "GRPOTrainer", "get_off_policy_mask")
        off_policy_mask.decorator_list = []
        ns = _compile(
            trainer_py,
            [
                _method(tree, "GRPOTrainer", "_compute_loss"),
                off_policy_mask,
                _as_function(
                    "importance_sampling_ratio",
                    ["self", "completion_mask", "tool_mask", "old_per_token_logps", "sampling_per_token_logps"],
                    block,
                ),
            ],
            {"torch": torch, "math": math, "nanmin": utils["nanmin"], "nanmax": utils["nanmax"]},
        )
        self._compute_loss, self._importance_sampling_ratio = ns["_compute_loss"], ns["importance_sampling_ratio"]
        self._get_off_policy_mask = ns["get_off_policy_mask"]
        self.settings = dict(
            loss_type=loss_type,
            epsilon_low=epsilon,
            epsilon_high=epsilon if epsilon_high is None else epsilon_high,
            importance_sampling_level=importance_sampling_level,
            beta=0.0,
            top_entropy_quantile=1.0,
            off_policy_mask_threshold=off_policy_mask_threshold,
            use_vllm=True,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode=vllm_importance_sampling_mode,
            vllm_importance_sampling_clip_min=vllm_importance_sampling_clip_min,
            vllm_importance_sampling_clip_max=vllm_importance_sampling_clip_max,
            aux_loss_enabled=False,
            _entropy_bonus_enabled=False,
            current_gradient_accumulation_steps=1,
            args=SimpleNamespace(delta=delta, steps_per_generation=1, use_bias_correction_kl=False),
        )

    def _trainer(self, per_token_logps: torch.Tensor) -> SimpleNamespace:
        trainer = SimpleNamespace(
            **self.settings,
            model=SimpleNamespace(training=True),
            accelerator=_Accelerator(),
            _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
            get_off_policy_mask=self._get_off_policy_mask,
        )
        entropies = torch.zeros_like(per_token_logps.detach())
        trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (per_token_logps, entropies, None)
        return trainer

    def __call__(self, per_token_logps, old_per_token_logps, sampling_per_token_logps, advantages, completion_mask):
        trainer = self._trainer(per_token_logps)
        ratio = self._importance_sampling_ratio(
            trainer, completion_mask, None, old_per_token_logps, sampling_per_token_logps
        )
        B, T = completion_mask.shape
        inputs = {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
            "prompt_mask": torch.ones_like(completion_mask[:, :1]),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": completion_mask,
            "advantages": advantages,
            "old_per_token_logps": old_per_token_logps,
            "importance_sampling_ratio": ratio,
            "sampling_per_token_logps": sampling_per_token_logps,  # in the batch whenever vLLM generated it
            "num_items_in_batch": completion_mask.sum(),
        }
        return self._compute_loss(trainer, None, inputs)
