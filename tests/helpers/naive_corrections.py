"""An independent, deliberately naive restatement of the spec's preset table (scalar Python, one
token at a time), used to derive golden values. It shares no code with runner/core/corrections.py."""

from __future__ import annotations

import math

INF = math.inf


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def _clip(x: float, lo: float | None, hi: float | None) -> float:
    if lo is not None:
        x = max(x, lo)
    if hi is not None:
        x = min(x, hi)
    return x


def _in(x: float, lo: float | None, hi: float | None) -> bool:
    return (lo is None or x >= lo) and (hi is None or x <= hi)


def _finite_or_0(x: float) -> float:
    """NeMo-RL's nan_to_num(x, nan=0, posinf=0, neginf=0)."""
    return x if math.isfinite(x) else 0.0


def coefficients(preset: str, old, roll, mask, low, high):
    """Per-token coefficient and the mask that the loss is reduced with, from the spec's table."""
    B, T = len(old), len(old[0])
    coef = [[0.0] * T for _ in range(B)]
    red = [[float(mask[i][t]) for t in range(T)] for i in range(B)]
    for i in range(B):
        lr = [old[i][t] - roll[i][t] for t in range(T)]
        inside = [mask[i][t] == 1 for t in range(T)]
        n = sum(inside)
        L = sum(lr[t] for t in range(T) if inside[t])
        G = L / max(n, 1)
        L20 = sum(_clip(lr[t], -20, 20) for t in range(T) if inside[t])
        rho = [_exp(x) for x in lr]
        rho_seq, rho_geo = _exp(L), _exp(G)
        L_finite = sum(_finite_or_0(lr[t]) for t in range(T) if inside[t])  # NeMo-RL's and AReaL's sanitising
        G_finite = L_finite / max(n, 1)
        for t in range(T):
            r = rho[t]
            if preset == "none":
                c = 1.0
            elif preset in ("tis", "openrlhf-bc71bb1/tis", "openrlhf-0.11/token-clip", "trl/token-truncate"):
                c = _clip(r, low, high)
            elif preset in ("icepop", "openrlhf-bc71bb1/icepop", "openrlhf-0.11/token-mask", "trl/token-mask"):
                c = r if _in(r, low, high) else 0.0
            elif preset == "seq-mask-tis":
                c = _clip(r, low, high) if _in(rho_geo, low, high) else 0.0
            elif preset in ("openrlhf-bc71bb1/seq-mask-tis", "openrlhf-0.11/seq-mask"):
                c = r if _in(rho_geo, low, high) else 0.0
            elif preset == "seq-tis":
                c = min(_exp(_clip(L, -20, 20)), high)
            elif preset == "seq-mis":
                c = _exp(_clip(L, -20, 20)) if _in(rho_seq, low, high) else 0.0
            elif preset == "geo-mask":
                c = 1.0
                if not _in(rho_geo, low, high):
                    c, red[i][t] = 0.0, 0.0
            elif preset == "trl/sequence-truncate":
                c = _clip(rho_seq, low, high)
            elif preset == "trl/sequence-mask":
                c = rho_seq if _in(rho_seq, low, high) else 0.0
            elif preset == "verl/token-tis":
                c = min(_exp(_clip(lr[t], -20, 20)), high)
            elif preset == "verl/seq-tis":
                c = min(_exp(_clip(L, -20, 20)), high)
            elif preset == "verl/icepop":
                w = _exp(_clip(lr[t], -20, 20))
                c = w if math.log(low) <= _clip(lr[t], -20, 20) <= math.log(high) else 0.0
            elif preset == "verl/geo-rs":
                stat = -sum(_clip(lr[s], -20, 20) for s in range(T) if inside[s]) / max(n, 1)
                c = 1.0
                if not (math.log(low) <= stat <= math.log(high)):
                    c, red[i][t] = 0.0, 0.0
            elif preset == "verl/seq-mis":
                c = min(_exp(_clip(L, -20, 20)), high)
                if not (math.log(low) <= -L20 <= math.log(high)):
                    c, red[i][t] = 0.0, 0.0
            elif preset == "nemo-rl/tis":
                c = _clip(_finite_or_0(r), low if low is not None else 0.0, high)
            elif preset == "nemo-rl/icepop":
                w = _finite_or_0(r)
                c = w if _in(w, low, high) else 0.0
            elif preset == "nemo-rl/seq-mask-tis":
                c = _finite_or_0(r) if _in(_exp(G_finite), low, high) else 0.0
            elif preset == "areal/token-mask":
                w = _exp(_finite_or_0(lr[t]))
                c = w if _in(w, low, high) else 0.0
            elif preset == "areal/token-clamp":
                c = _clip(_exp(_finite_or_0(lr[t])), low if low is not None else 0.0, high)
            elif preset == "areal/sequence-mask":
                c = _exp(G_finite) if _in(_exp(G_finite), low, high) else 0.0
            elif preset == "areal/sequence-clamp":
                c = _clip(_exp(G_finite), low if low is not None else 0.0, high)
            elif preset == "areal/sequence-mask-sum":
                c = _exp(G_finite) if _in(_exp(L_finite), low, high) else 0.0
            elif preset == "skyrl/tis-token":
                c = min(_exp(_clip(lr[t], -20, 20)), high)
            elif preset == "skyrl/tis-sequence":
                c = min(_exp(_clip(L, -20, 20)), high)
            elif preset == "skyrl/token-mask-is":
                c = 1.0 if _in(_exp(_clip(lr[t], -20, 20)), low, high) else 0.0
            elif preset == "prime-rl/default":
                c = 1.0
            elif preset.startswith("roll/is-"):
                level = preset.removeprefix("roll/is-")
                w = {"token": r, "segment": _exp(_run_mean(lr, inside, t)), "geometric": rho_geo, "sequence": rho_seq}
                c = min(w[level], high)
            elif preset.startswith(("roll/filter-", "roll/diff-", "roll/ratio-diff-")):
                c = 1.0 if _roll_kept(preset, old[i], roll[i], inside, t, low, high) else 0.0
                red[i][t] = red[i][t] * c
            else:
                raise KeyError(preset)
            coef[i][t] = c if inside[t] else 0.0
    return coef, red


def ppo_token_mean(preset, case, low, high, eps=0.2):
    """Loss and d loss / d log_probs of PPO + token-mean, by hand."""
    lp, old, roll, adv, mask = (
        case[k] for k in ("log_probs", "old_log_probs", "rollout_log_probs", "advantages", "action_mask")
    )
    coef, red = coefficients(preset, old, roll, mask, low, high)
    B, T = len(lp), len(lp[0])
    denom = sum(red[i][t] for i in range(B) for t in range(T))
    total, grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if not red[i][t]:
                continue
            r = _exp(_clip(lp[i][t] - old[i][t], -20, 20))
            a = adv[i][t]
            s1, s2 = r * a, _clip(r, 1 - eps, 1 + eps) * a
            term = -min(s1, s2)
            # d(−min)/dr: the unclipped branch carries r·A; the clipped one is flat outside the clip
            active_unclipped = s1 <= s2 or (1 - eps) <= r <= (1 + eps)
            dterm = -a * r if active_unclipped else 0.0
            total += coef[i][t] * term
            grad[i][t] = coef[i][t] * dterm
    if denom == 0:
        return 0.0, [[0.0] * T for _ in range(B)]
    return total / denom, [[g / denom for g in row] for row in grad]


def _run_mean(values, inside, t) -> float:
    """The mean of values over t's run of consecutive masked-in tokens (ROLL's segment); 0 outside every run."""
    if not inside[t]:
        return 0.0
    a, b = t, t
    while a > 0 and inside[a - 1]:
        a -= 1
    while b + 1 < len(inside) and inside[b + 1]:
        b += 1
    return sum(values[a : b + 1]) / (b + 1 - a)


def _roll_kept(preset, old, roll, inside, t, low, high) -> bool:
    """ROLL's filters: the ratio filter at the preset's level, and the probability-difference filter
    exp(old) − exp(roll) (roll/diff-token: [−0.2, 0.2] per token; roll/ratio-diff-segment: [−0.1, 0.1] per segment)."""
    lr = [o - r for o, r in zip(old, roll)]
    diff = [math.exp(o) - math.exp(r) for o, r in zip(old, roll)]
    n = max(sum(inside), 1)

    def at(level, values, exp):
        if level == "token":
            x = values[t]
        elif level == "segment":
            x = _run_mean(values, inside, t)
        else:
            x = sum(v for v, m in zip(values, inside) if m)
            x = x / n if level == "geometric" else x
        return _exp(x) if exp else x

    if preset == "roll/diff-token":
        return _in(at("token", diff, False), -0.2, 0.2)
    if preset == "roll/ratio-diff-segment":
        return _in(at("segment", lr, True), low, high) and _in(at("segment", diff, False), -0.1, 0.1)
    return _in(at(preset.removeprefix("roll/filter-"), lr, True), low, high)
