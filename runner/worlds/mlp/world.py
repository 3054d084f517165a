"""`policy=mlp`: one network shared by every state, with an exact objective for count tasks.

The policy writes `rollout.seq_len` tokens over `rollout.vocab_size`; token t is drawn from
π_θ(· | prev, count, t), an MLP of the previous token, the number of task target tokens so far in
the response and the position (model.py: the features, the network, its experts and how it runs in
low precision). Sharing is the point: an update made in one state moves the policy in every state
that looks like it, which a table cannot do.

- Prompts are BOS (= V) and `rollout.prompt_len − 1` uniform tokens; only the last one reaches the
  network, as the previous token of position 0.
- The count needs the task's targets: a count task gives `is_target`. Any other task leaves the
  count feature at 0 in every state (the network then sees prev and t only) and there is no exact J.
- `rollout.eos_token` ends a response right after the first EOS (the EOS is an action; the rest is
  padding, mask 0). The state is explicit, so the sampler keeps (prev, count, t) per row: no cache.
- Precision: the trainer's `logits(..., FP32)` and the engine's `logits` / `sampler` in bf16, fp16
  or fp8 are one forward pass (model.py `Net.forward`), so the mismatch is the arithmetic's.
- exact.py: J(θ) by dynamic programming over (position, prev, count), for any count task.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from runner.config_checks import as_float, as_int, check_keys
from runner.errors import UserError
from runner.tasks.base import CountTask
from runner.worlds.mlp.exact import CountDP, PositionDP, PromptsDP
from runner.worlds.mlp.model import DEFAULT_STATE, STATE_PARTS, Net, Route
from runner.worlds.precision import FP32, Precision
from runner.worlds.protocol import Params, TokenStats, World, param_count

POLICY_KEYS = ("name", "description", "layers", "hidden", "experts", "init_std", "state")


class MLPWorld(World):
    name = "mlp"

    def __init__(self, net: Net, prompt_len: int = 1, eos_token: int | None = None, task: Any = None):
        self.net = net
        self.vocab_size, self.seq_len = net.vocab_size, net.seq_len
        self.prompt_len, self.eos_token = prompt_len, eos_token
        self.task = task
        self.is_target = torch.zeros(net.vocab_size, dtype=torch.bool)  # [V]
        self.exact = None
        if isinstance(task, CountTask):
            self.is_target = task.is_target
            start_prev = torch.tensor([self.bos]) if prompt_len == 1 else torch.arange(self.vocab_size)
            prompts = task.prompt_tokens() if hasattr(task, "prompt_tokens") else start_prev
            if "count" not in net.sees:
                self.exact = PositionDP(net, task, start_prev, eos_token)
            elif hasattr(task, "prompt_tokens") or ("prompt" in net.sees and prompts.numel() > 1):
                self.exact = PromptsDP(net, task, prompts, eos_token)
            else:
                self.exact = CountDP(net, task, start_prev, eos_token, int(start_prev[0]))

    @classmethod
    def from_config(cls, policy: Mapping[str, Any], rollout: Mapping[str, Any], task: Any) -> MLPWorld:
        check_keys("policy", policy, POLICY_KEYS)
        experts = as_int("policy", policy, "experts", low=0, default=0)
        if experts == 1:
            raise UserError("policy.experts must be 0 (dense) or >= 2, got 1 (one expert is a dense layer)")
        vocab = as_int("rollout", rollout, "vocab_size", low=2)
        task_vocab = getattr(task, "vocab_size", None)
        if task_vocab is not None and task_vocab != vocab:
            raise UserError(f"task {task.name} has {task_vocab} tokens but rollout.vocab_size is {vocab}")
        eos = rollout.get("eos_token")
        if eos is not None:
            eos = as_int("rollout", rollout, "eos_token", low=0, high=vocab - 1)
        net = Net(
            vocab_size=vocab,
            seq_len=as_int("rollout", rollout, "seq_len", low=1),
            layers=as_int("policy", policy, "layers", low=1, default=2),
            hidden=as_int("policy", policy, "hidden", low=1, default=64),
            experts=experts,
            init_std=as_float("policy", policy, "init_std", low=0.0, default=0.02),
            state=_state(policy),
        )
        return cls(net, as_int("rollout", rollout, "prompt_len", low=1, default=1), eos, task)

    @property
    def bos(self) -> int:
        return self.vocab_size

    def init_params(self, generator: torch.Generator) -> Params:
        return self.net.init_params(generator)

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, prompt_len] long: BOS, then uniform tokens; or the task's own prompts (count-asked)."""
        asked = self.task.sample_prompts(n, generator) if self.task is not None else None
        if asked is not None:
            return asked
        device = generator.device
        prompts = torch.full((n, self.prompt_len), self.bos, dtype=torch.long, device=device)
        if self.prompt_len > 1:
            prompts[:, 1:] = torch.randint(
                self.vocab_size, (n, self.prompt_len - 1), generator=generator, device=device
            )
        return prompts

    @property
    def reads_own_tokens(self) -> bool:
        """Whether the policy at position t depends on the response so far (its previous token or its
        count). When it does not, the policy is a function of (prompt, position) only, evaluated once
        on the states that occur (`position_logits`), and the engine samples every position at once."""
        return bool({"previous", "count"} & self.net.sees)

    def prompt_rows(self) -> torch.Tensor:
        """[R] the prompt tokens `position_logits` has a row for: the task's prompts, every token (and
        BOS) for a net that sees some other prompt, one row for a net that sees none."""
        if "prompt" not in self.net.sees:
            return torch.zeros(1, dtype=torch.long)
        if hasattr(self.task, "prompt_tokens"):
            return self.task.prompt_tokens()
        return torch.arange(self.vocab_size + 1)

    def position_logits(self, params: Params, precision: Precision = FP32) -> torch.Tensor:
        """[R, T, V] logits of every (prompt row, position) state, in one forward pass whose shape does
        not depend on the batch, so the trainer and the engine get the same numbers for a state."""
        rows, T = self.prompt_rows().to(params["out.bias"].device), self.seq_len
        position = torch.arange(T, device=rows.device).repeat(rows.numel())  # [R·T]: row-major
        prompt = rows.repeat_interleave(T)
        logits = self.state_logits(
            Net.cast(params, precision), params, prompt, torch.zeros_like(prompt), position, precision, prompt
        )
        return logits.view(rows.numel(), T, self.vocab_size)

    def row_of(self, prompts: torch.Tensor) -> torch.Tensor:
        """[N] the row of position_logits for each prompt."""
        return prompts[:, -1] if "prompt" in self.net.sees else torch.zeros_like(prompts[:, -1])

    def logits(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, precision: Precision = FP32
    ) -> torch.Tensor:
        n, T = tokens.shape
        if not self.reads_own_tokens:
            return self.position_logits(params, precision)[self.row_of(prompts)]  # [N, T, V]
        prev = torch.cat([prompts[:, -1:], tokens[:, :-1]], 1)  # [N, T]
        hits = self.is_target.to(tokens.device)[tokens].long()  # [N, T]
        count = hits.cumsum(1) - hits  # [N, T]: targets before position t
        position = torch.arange(T, device=tokens.device).expand(n, T)  # [N, T]
        engine = Net.cast(params, precision)
        prompt = prompts[:, -1:].expand(n, T)  # [N, T]
        logits = self.state_logits(
            engine, params, prev.reshape(-1), count.reshape(-1), position.reshape(-1), precision, prompt.reshape(-1)
        )
        return logits.view(n, T, self.vocab_size)

    def token_stats(self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, entropy: bool = True):
        """As World.token_stats; a policy of (prompt, position) alone takes its log-softmax once per
        state that occurs ([R, T, V]) and looks the batch's tokens up in it."""
        if self.reads_own_tokens:
            return super().token_stats(params, prompts, tokens, entropy)
        table = torch.log_softmax(self.position_logits(params, FP32).float(), dim=-1)  # [R, T, V]
        rows = self.row_of(prompts).unsqueeze(1)  # [N, 1]
        logp = table[rows, torch.arange(tokens.shape[1], device=tokens.device), tokens]  # [N, T]
        ent = None
        if entropy:
            with torch.no_grad():
                ent = (-(table.exp() * table).sum(-1))[rows.squeeze(1)]  # [N, T]
        return TokenStats(logp=logp, entropy=ent)

    def sampler(self, params: Params, prompts: torch.Tensor, precision: Precision) -> MLPSampler:
        return MLPSampler(self, params, prompts, precision)

    def state_logits(
        self,
        engine: Params,
        params: Params,
        prev: torch.Tensor,
        count: torch.Tensor,
        position: torch.Tensor,
        precision: Precision,
        prompt: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[N] states → [N, V] logits in the compute dtype. `engine` = Net.cast(params, precision);
        the fp32 `params` give the routes when the precision replays the trainer's routing."""
        table = self.net.encoding_table(params["out.bias"].dtype, params["out.bias"].device)
        feats = self.net.features(prev, count, position, table, prompt)  # [N, D]
        routes: list[Route] | None = None
        if precision.router_fp32 and self.net.experts and not precision.exact:
            with torch.no_grad():
                _, routes = self.net.forward(params, feats, FP32)
        return self.net.forward(engine, feats, precision, routes)[0]

    def summary(self) -> dict[str, Any]:
        net = self.net
        return {
            **super().summary(),
            "layers": net.layers,
            "hidden": net.hidden,
            "experts": net.experts,
            "init_std": net.init_std,
            "state": list(net.state),
            "features": net.feature_dim,
            "parameters": param_count(net.init_params(torch.Generator().manual_seed(0))),
        }


def _state(policy: Mapping[str, Any]) -> tuple[str, ...]:
    """policy.state: the parts of the state the network sees, in STATE_PARTS' order."""
    state = policy.get("state", list(DEFAULT_STATE))
    if isinstance(state, str) or not isinstance(state, (list, tuple)) or not state:
        raise UserError(f"policy.state must be a non-empty list of {', '.join(STATE_PARTS)}; got {state!r}")
    unknown = [part for part in state if part not in STATE_PARTS]
    if unknown:
        raise UserError(f"policy.state: unknown part {unknown[0]!r}; valid: {', '.join(STATE_PARTS)}")
    return tuple(part for part in STATE_PARTS if part in state)


class MLPSampler:
    """The engine's view, one position at a time: the state (prev, count, t) of every row is kept
    explicitly, and each call is one [N, D] forward pass, vectorised over the batch."""

    def __init__(self, world: MLPWorld, params: Params, prompts: torch.Tensor, precision: Precision):
        self.world, self.precision = world, precision
        self.params = {name: p.detach() for name, p in params.items()}
        self.engine = Net.cast(self.params, precision)
        self.prev = prompts[:, -1]  # [N]
        self.prompt = prompts[:, -1]  # [N]: what a net that sees the prompt sees at every position
        self.table = None  # [N, T, V] when the policy does not read its own tokens: looked up, not recomputed
        if not world.reads_own_tokens:
            with torch.no_grad():
                self.table = world.position_logits(self.params, precision)[world.row_of(prompts)]
        self.is_target = world.is_target.to(prompts.device)  # [V]
        self.count = torch.zeros_like(self.prev)  # [N]
        self.t = 0

    def start(self) -> torch.Tensor:
        return self._logits()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.count = self.count + self.is_target[tokens].long()
        self.prev = tokens
        self.t += 1
        return self._logits()

    def _logits(self) -> torch.Tensor:
        if self.table is not None:
            return self.table[:, self.t]
        with torch.no_grad():
            return self.world.state_logits(
                self.engine,
                self.params,
                self.prev,
                self.count,
                torch.full_like(self.prev, self.t),
                self.precision,
                self.prompt,
            )  # [N, V]
