"""The MLP policy's network: state features → one MLP shared by every state → V logits, in any Precision.

State and features. Response token t is drawn in the state (prev, count, t): the previous token
(the last prompt token at t = 0; BOS = V), the number of task target tokens among the response's
first t tokens, and the position. The network sees

    one_hot(prev)      [V+1]
    enc(count)         [1 + 2J]   count/T, sin(ω_j·count), cos(ω_j·count)
    enc(t)             [1 + 2J]   t/T,     sin(ω_j·t),     cos(ω_j·t)
    ω_j = π·2^j / T for j < J = ⌊log₂(T/2)⌋ + 1: periods 2T, T, ..., down to 4 tokens

so D = V + 3 + 4J features (47 at V = 16, T = 128). The sinusoids are a transformer's positional
encoding: the low frequencies let nearby counts and positions share what they learn (a change made
at count 5 moves count 6), the high ones let the net still tell count = k from k ± 1, which a
sparse count reward needs. The encodings are tabulated once for 0..T and indexed, so a state's
features are the same numbers whichever batch it sits in.

Network. h_0 = features; h_l = silu(W_l h_{l−1} + b_l) for l = 1..layers (width `hidden`);
logits = W_out h_L + b_out.

Experts (`experts` = E ≥ 2, Switch-Transformer style). Every hidden layer holds E expert weight
sets and a router R_l [E, D_in] (no bias): r = R_l h_{l−1}, e* = argmax r, and
h_l = softmax(r)[e*] · silu(W_{l,e*} h_{l−1} + b_{l,e*}). The argmax has no gradient; the gate
softmax(r)[e*] is what trains the router. All E experts are computed for every row and the chosen
one gathered, so every row's numbers come from one matmul whose shape does not depend on how the
batch was routed (the price: E× a dense layer's arithmetic; scripts/bench_mlp.py measures it). The
exact solver computes only each row's own expert (`batch_invariant=False`): its float64 needs no
such guarantee.

Init. W_l, R_l ~ N(0, 1/fan_in), b_l = 0; W_out ~ N(0, init_std²), b_out = 0. At the default
init_std = 0.02 (GPT-2's) the logits of a state spread by about 0.025 (0.003 with 4 experts, whose
gates start near 1/E): a near-uniform policy, entropy within 0.06% of log V in every state
(measured at V = 16, T = 64 and 128).

Precision. `forward` takes the engine's copy of the parameters (`cast`: `Precision.weights` once per
tensor, fp8 with one scale per tensor) and rounds every matmul input through
`Precision.activations` (fp8: one scale per row); the matmuls, the bias adds, silu, the router's
scores and softmax and the logits are in `Precision.compute` (a matmul's products accumulated in
fp32 and rounded once, as CPU and GPU kernels do). An exact precision (fp32) casts nothing: the
arithmetic is whatever dtype the parameters are in, the trainer's float32 or the exact solver's
float64. With `router_fp32` (mismatch.router_replay) the caller takes the routes (expert and gate
per layer) from the fp32 forward pass and hands them to the low-precision one: the engine routes
exactly as the trainer does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runner.worlds.precision import Precision
from runner.worlds.protocol import Params

STATE_PARTS = ("prompt", "previous", "count", "position")
DEFAULT_STATE = ("previous", "count", "position")


@functools.lru_cache(maxsize=16)
def _encoding_table(seq_len: int, frequencies: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    x = torch.arange(seq_len + 1, dtype=torch.float64).unsqueeze(-1)  # [T+1, 1]
    omega = math.pi * 2.0 ** torch.arange(frequencies, dtype=torch.float64) / seq_len  # [J]
    table = torch.cat([x / seq_len, torch.sin(x * omega), torch.cos(x * omega)], -1)
    return table.to(device=device, dtype=dtype)


@dataclass
class Route:
    expert: torch.Tensor  # [N] long: the chosen expert of each row
    gate: torch.Tensor  # [N] softmax(r)[expert], in the router's dtype


@dataclass(frozen=True)
class Net:
    vocab_size: int
    seq_len: int
    layers: int = 2
    hidden: int = 64
    experts: int = 0  # 0: dense
    init_std: float = 0.02
    state: tuple[str, ...] = DEFAULT_STATE  # what the network sees, a subset of STATE_PARTS

    # ------------------------------------------------------------------------------ features
    @property
    def frequencies(self) -> int:
        return int(math.floor(math.log2(max(self.seq_len, 2) / 2))) + 1

    @property
    def feature_dim(self) -> int:
        widths = {"prompt": self.vocab_size + 1, "previous": self.vocab_size + 1, "count": 1 + 2 * self.frequencies}
        widths["position"] = widths["count"]
        return sum(widths[part] for part in self.state)

    @property
    def sees(self) -> frozenset[str]:
        return frozenset(self.state)

    def encoding_table(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """[T+1, 1 + 2J] enc(x) for x = 0..T, computed in float64 (on the CPU, so every device gets the same
        numbers) and rounded once to dtype. Cached: the sampler asks for it at every position."""
        return _encoding_table(self.seq_len, self.frequencies, dtype, torch.device(device))

    def features(
        self,
        prev: torch.Tensor,
        count: torch.Tensor,
        position: torch.Tensor,
        table: torch.Tensor,
        prompt: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[N] long prev (BOS = V), count, position, and the prompt's last token → [N, D] in the table's
        dtype: the parts of `state` side by side, in STATE_PARTS' order; a part the net does not see is
        not looked at."""
        parts = []
        if "prompt" in self.sees:
            parts.append(F.one_hot(prompt, self.vocab_size + 1).to(table.dtype))  # [N, V+1]
        if "previous" in self.sees:
            parts.append(F.one_hot(prev, self.vocab_size + 1).to(table.dtype))  # [N, V+1]
        if "count" in self.sees:
            parts.append(table[count])  # [N, 1+2J]
        if "position" in self.sees:
            parts.append(table[position])  # [N, 1+2J]
        return torch.cat(parts, -1)  # [N, D]

    # ---------------------------------------------------------------------------- parameters
    def init_params(self, generator: torch.Generator) -> Params:
        device = generator.device

        def normal(*shape: int, std: float) -> torch.Tensor:
            return std * torch.randn(*shape, generator=generator, device=device)

        params: Params = {}
        fan_in, H, E = self.feature_dim, self.hidden, self.experts
        for layer in range(self.layers):
            if E:
                params[f"layer{layer}.router"] = normal(E, fan_in, std=fan_in**-0.5)  # [E, D_in]
                params[f"layer{layer}.weight"] = normal(E, H, fan_in, std=fan_in**-0.5)  # [E, H, D_in]
                params[f"layer{layer}.bias"] = torch.zeros(E, H, device=device)
            else:
                params[f"layer{layer}.weight"] = normal(H, fan_in, std=fan_in**-0.5)  # [H, D_in]
                params[f"layer{layer}.bias"] = torch.zeros(H, device=device)
            fan_in = H
        params["out.weight"] = normal(self.vocab_size, H, std=self.init_std)  # [V, H]
        params["out.bias"] = torch.zeros(self.vocab_size, device=device)
        return params

    @staticmethod
    def cast(params: Params, precision: Precision) -> Params:
        """The engine's copy of the parameters (the same tensors when the precision is exact)."""
        if precision.exact:
            return params
        return {name: precision.weights(p) for name, p in params.items()}

    # ------------------------------------------------------------------------------- forward
    def forward(
        self,
        params: Params,
        feats: torch.Tensor,
        precision: Precision,
        routes: list[Route] | None = None,
        batch_invariant: bool = True,
    ) -> tuple[torch.Tensor, list[Route]]:
        """[N, D] features → ([N, V] logits in the compute dtype, the routes taken). `params` come
        from `cast(·, precision)`; `routes` replays given routing decisions instead of routing.
        `batch_invariant=False` (the exact solver, whose float64 does not care about a row's last
        bits) computes only each row's own expert, rows grouped by expert (1/E of the work), and the
        router as a plain matmul."""

        def rounded(x: torch.Tensor) -> torch.Tensor:
            return x if precision.exact else precision.activations(x)

        x = rounded(feats)  # [N, D]
        taken: list[Route] = []
        for layer in range(self.layers):
            weight, bias = params[f"layer{layer}.weight"], params[f"layer{layer}.bias"]
            if not self.experts:
                x = F.silu(x @ weight.T + bias)  # [N, H]
            else:
                route = (
                    routes[layer]
                    if routes is not None
                    else self._route(x, params[f"layer{layer}.router"], batch_invariant)
                )
                chosen = (self._every_expert if batch_invariant else self._own_expert)(
                    x, weight, bias, route.expert
                )  # [N, H]
                x = route.gate.to(chosen.dtype).unsqueeze(-1) * F.silu(chosen)  # [N, H]
                taken.append(route)
            x = rounded(x)
        return x @ params["out.weight"].T + params["out.bias"], taken  # [N, V]

    @staticmethod
    def _every_expert(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        n, (E, H, _) = x.shape[0], weight.shape
        every = x @ weight.reshape(E * H, -1).T + bias.reshape(E * H)  # [N, E·H]
        return every.view(n, E, H).gather(1, expert.view(n, 1, 1).expand(n, 1, H)).squeeze(1)  # [N, H]

    @staticmethod
    def _own_expert(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        order = expert.argsort()  # [N]: rows grouped by expert
        sizes = torch.bincount(expert, minlength=weight.shape[0]).tolist()
        groups = x[order].split(sizes)
        out = torch.cat([rows @ weight[e].T + bias[e] for e, rows in enumerate(groups)])  # [N, H], grouped
        return out[order.argsort()]  # [N, H], back in row order

    @staticmethod
    def _route(x: torch.Tensor, router: torch.Tensor, batch_invariant: bool) -> Route:
        if batch_invariant:
            # Not `x @ router.T`: a GEMM this narrow takes a path in MKL whose result for a row depends
            # on where the row sits in the batch (measured: 114 of 64 rows off by ~1e-7 at D = 39,
            # E = 4), and a route must not. A product-sum accumulated in fp32 as the GEMM would.
            acc = torch.promote_types(x.dtype, torch.float32)
            scores = (x.to(acc).unsqueeze(1) * router.to(acc)).sum(-1).to(x.dtype)  # [N, E]
        else:
            scores = x @ router.T  # [N, E]
        expert = scores.argmax(-1)  # [N]: a tie goes to the lower index
        gate = torch.softmax(scores, dim=-1).gather(-1, expert.unsqueeze(-1)).squeeze(-1)  # [N]
        return Route(expert=expert, gate=gate)
