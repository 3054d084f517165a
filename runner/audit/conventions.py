"""How an external loss is called: which parameter receives which tensor, and where the loss is in
what it returns. `--convention` picks a framework's names, `--arg-map` changes single roles,
`--loss-key` picks the loss out of a tuple or dict, `--call-kwargs` adds forward-time arguments.

Roles (the audit's names for the [B, T] tensors):

    lp       log-probs under π_θ (requires grad; the gradient is taken with respect to it)
    old      log-probs under π_old
    roll     log-probs under π_rollout (the inference engine)
    adv      advantages
    mask     the action mask (0/1, in the float dtype of the others)
    weights  the coefficients of --weights-fn, for a loss that takes them precomputed (verl)

A role maps to a keyword (`mask=action_mask`) or a position (`lp=0`); `-` leaves the role out.
A weights function is called with the roles old, roll, mask and log_ratio (old − roll) bound by the
names its signature has (its convention's names, or `log_ratio`), or as fn(old, roll, mask) when
it has none of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.errors import UserError

ROLES = ("lp", "old", "roll", "adv", "mask", "weights")
Param = str | int


@dataclass(frozen=True)
class Convention:
    name: str
    params: Mapping[str, Param]  # role → keyword or position, for the loss
    weights_params: Mapping[str, str]  # role → keyword, for a weights function
    returns: str  # what the loss returns, for the help text


CONVENTIONS: dict[str, Convention] = {
    "openrlhf": Convention(
        "openrlhf",
        {"lp": 0, "old": 1, "adv": 2, "mask": "action_mask", "roll": "rollout_log_probs"},
        {"old": "old_log_probs", "roll": "rollout_log_probs", "mask": "action_mask"},
        "loss or (loss, ...)",
    ),
    "verl": Convention(
        "verl",
        {
            "old": "old_log_prob",
            "lp": "log_prob",
            "adv": "advantages",
            "mask": "response_mask",
            "weights": "rollout_is_weights",
        },
        {"old": "old_log_prob", "roll": "rollout_log_prob", "mask": "response_mask"},
        "(loss, metrics)",
    ),
    "trl": Convention(
        "trl",
        {
            "lp": "per_token_logps",
            "old": "old_per_token_logps",
            "roll": "sampling_per_token_logps",
            "adv": "advantages",
            "mask": "completion_mask",
            "weights": "importance_sampling_ratio",
        },
        {"old": "old_per_token_logps", "roll": "sampling_per_token_logps", "mask": "completion_mask"},
        "loss",
    ),
    "plain": Convention(
        "plain",
        {
            "lp": "log_probs",
            "old": "old_log_probs",
            "roll": "rollout_log_probs",
            "adv": "advantages",
            "mask": "action_mask",
            "weights": "weights",
        },
        {"old": "old_log_probs", "roll": "rollout_log_probs", "mask": "action_mask"},
        "loss",
    ),
}


def parse_arg_map(text: str | None) -> dict[str, Param | None]:
    """`old=old_log_prob,lp=0,roll=-` → {"old": "old_log_prob", "lp": 0, "roll": None}."""
    out: dict[str, Param | None] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        role, sep, param = (s.strip() for s in item.partition("="))
        if not sep or not param:
            raise UserError(f"--arg-map: expected ROLE=PARAM, got {item.strip()!r}")
        if role not in ROLES:
            raise UserError(f"--arg-map: unknown role {role!r}; roles: {', '.join(ROLES)}")
        if param == "-":
            out[role] = None
        elif param.isdigit():
            out[role] = int(param)
        elif param.isidentifier():
            out[role] = param
        else:
            raise UserError(f"--arg-map: {role}={param!r} is neither a parameter name, a position nor '-'")
    return out


def parse_loss_key(text: str | None) -> str | int | None:
    if text is None or not text.strip():
        return None
    return int(text) if text.strip().lstrip("-").isdigit() else text.strip()


@dataclass(frozen=True)
class Caller:
    """Calls a loss with the audit's tensors under a convention and picks the loss out."""

    convention: Convention
    params: Mapping[str, Param]
    loss_key: str | int | None = None
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        convention: str,
        arg_map: str | None = None,
        loss_key: str | None = None,
        call_kwargs: Mapping[str, Any] | None = None,
    ) -> Caller:
        if convention not in CONVENTIONS:
            raise UserError(f"--convention {convention!r} is not one of: {', '.join(CONVENTIONS)}")
        conv = CONVENTIONS[convention]
        params: dict[str, Param] = dict(conv.params)
        for role, param in parse_arg_map(arg_map).items():
            if param is None:
                params.pop(role, None)
            else:
                params[role] = param
        positions = sorted(p for p in params.values() if isinstance(p, int))
        if positions != list(range(len(positions))):
            raise UserError(f"--arg-map: positions must be 0, 1, 2, ... without gaps, got {positions}")
        names = [p for p in params.values() if isinstance(p, str)]
        if len(set(names)) != len(names):
            raise UserError("--arg-map: two roles map to the same parameter")
        clash = sorted(set(names) & set(call_kwargs or {}))
        if clash:
            raise UserError(f"--call-kwargs sets {', '.join(clash)}, which the audit passes itself")
        return cls(conv, params, parse_loss_key(loss_key), dict(call_kwargs or {}))

    @property
    def takes_weights(self) -> bool:
        return "weights" in self.params

    def describe(self) -> str:
        positional = sorted((p, r) for r, p in self.params.items() if isinstance(p, int))
        keywords = [f"{p}=<{r}>" for r, p in self.params.items() if isinstance(p, str)]
        extra = [f"{k}=..." for k in self.call_kwargs]
        return f"({', '.join([f'<{r}>' for _, r in positional] + keywords + extra)})"

    def __call__(self, fn: Callable[..., Any], tensors: Mapping[str, torch.Tensor]) -> Any:
        args: list[Any] = [None] * sum(isinstance(p, int) for p in self.params.values())
        kwargs: dict[str, Any] = dict(self.call_kwargs)
        for role, param in self.params.items():
            if role not in tensors:
                continue
            if isinstance(param, int):
                args[param] = tensors[role]
            else:
                kwargs[param] = tensors[role]
        return fn(*args, **kwargs)

    def pick_loss(self, result: Any) -> Any:
        """The loss out of what the target returned (LossShapeError when it is not there)."""
        key = self.loss_key
        if isinstance(result, Mapping):
            key = "loss" if key is None else key
            if key not in result:
                raise LossShapeError(
                    f"returned a dict without {key!r} (keys: {', '.join(map(str, result))}); "
                    "pick the loss with --loss-key"
                )
            return result[key]
        if isinstance(result, (tuple, list)):
            key = 0 if key is None else key
            if not isinstance(key, int) or not -len(result) <= key < len(result):
                raise LossShapeError(
                    f"returned a {type(result).__name__} of {len(result)} items; --loss-key {key!r} does not index it"
                )
            return result[key]
        return result

    def weights_kwargs(self, fn: Callable[..., Any], tensors: Mapping[str, torch.Tensor]) -> tuple[list, dict]:
        """(args, kwargs) for a weights function: by the names its signature has, else (old, roll, mask)."""
        candidates: dict[str, set] = {"log_ratio": {"log_ratio"}}
        for role in ("old", "roll", "mask"):
            candidates[role] = {self.convention.weights_params[role]}
            if isinstance(self.params.get(role), str):
                candidates[role].add(self.params[role])  # an --arg-map name applies here too
        try:
            accepted = set(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            accepted = set()
        bound = {name: tensors[role] for role, names in candidates.items() for name in names & accepted}
        if bound:
            return [], bound
        return [tensors["old"], tensors["roll"], tensors["mask"]], {}


class LossShapeError(Exception):
    """The target returned something the audit cannot read a loss from."""
