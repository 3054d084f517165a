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


def _outside(x: float, lo: float | None, hi: float | None) -> bool:
    """SkyRL's test: strictly above or below; a NaN is neither."""
    return (lo is not None and x < lo) or (hi is not None and x > hi)


def _kl(lr: float, k: str) -> float:
    """AReaL's KL estimators of one log-ratio."""
    if k == "k1":
        return lr
    if k == "k2":
        return lr * lr / 2.0
    return _exp(-lr) - 1.0 + lr


def _m2po_kept(old, roll, mask, threshold: float) -> set:
    """M2PO over the batch: masked-in tokens by lr² from the largest; drop the fewest so that the mean of
    the rest is under the threshold (all but the smallest if it never is). Returns the kept (i, t)."""
    tokens = [(i, t) for i in range(len(old)) for t in range(len(old[0])) if mask[i][t] == 1]
    m2 = {it: (old[it[0]][it[1]] - roll[it[0]][it[1]]) ** 2 for it in tokens}
    ordered = sorted(tokens, key=lambda it: -m2[it])
    if not ordered:
        return set()
    n_drop = len(ordered) - 1
    for k in range(len(ordered)):
        rest = [m2[it] for it in ordered[k:]]
        if sum(rest) / len(rest) < threshold:
            n_drop = k
            break
    return set(ordered[n_drop:])


def _slime_token_mean(old, roll, mask, high):
    """slime's tis_batch_normalize at the token level: the mean of min(exp(clamp(lr, ±20)), high) over every
    masked-in token of the batch, or None (no division) when it is not above 1e-8."""
    ws = [
        min(_exp(_clip(o - r, -20, 20)), high)
        for o_row, r_row, m_row in zip(old, roll, mask)
        for o, r, m in zip(o_row, r_row, m_row)
        if m == 1
    ]
    mean = sum(ws) / max(len(ws), 1)
    return mean if mean > 1e-8 else None


def _slime_mis(preset, lr_t, L, G, inside_lr, low, high, batch_mean):
    """slime's MIS helper (mis.py, compute_mis_weights) for one token."""
    if preset in ("slime/mis-rs-veto", "slime/mis-batch-normalize"):
        w = min(_exp(_clip(lr_t, -20, 20)), high)
        if batch_mean is not None:
            w = w / batch_mean
        vetoed = any(x < math.log(1e-4) for x in inside_lr)
        return w if _in(_exp(_clip(lr_t, -20, 20)), low, high) and not vetoed else 0.0
    _, mode, level = preset.split("-")
    w = _exp(_clip({"token": lr_t, "sequence": L, "geometric": G}[level], -20, 20))
    if mode == "truncate":
        return min(w, high)
    if mode == "clip":
        return _clip(w, low, high)
    return w if _in(w, low, high) else 0.0


def coefficients(preset: str, old, roll, mask, low, high, lp=None, adv=None):
    """Per-token coefficient and the mask that the loss is reduced with, from the spec's table (lp and adv: for
    the presets that read the current policy and the advantage, TRL's off-policy sequence mask)."""
    B, T = len(old), len(old[0])
    coef = [[0.0] * T for _ in range(B)]
    red = [[float(mask[i][t]) for t in range(T)] for i in range(B)]
    m2_kept = _m2po_kept(old, roll, mask, 0.04) if preset == "areal/m2po" else set()
    batch_mean = _slime_token_mean(old, roll, mask, high) if preset == "slime/mis-batch-normalize" else None
    for i in range(B):
        lr = [old[i][t] - roll[i][t] for t in range(T)]
        inside = [mask[i][t] == 1 for t in range(T)]
        n = sum(inside)
        L = sum(lr[t] for t in range(T) if inside[t])
        G = L / max(n, 1)
        L20 = sum(_clip(lr[t], -20, 20) for t in range(T) if inside[t])
        rho = [_exp(x) for x in lr]
        rho_seq, rho_geo = _exp(L), _exp(G)
        inside_lr = [lr[t] for t in range(T) if inside[t]]
        L_finite = sum(_finite_or_0(lr[t]) for t in range(T) if inside[t])  # NeMo-RL's and AReaL's sanitising
        G_finite = L_finite / max(n, 1)
        # SkyRL's token mask at 0.5-2.0 and the sums over the tokens it keeps
        kept = [inside[t] and _in(_exp(_clip(lr[t], -20, 20)), 0.5, 2.0) for t in range(T)]
        n_kept = sum(kept)
        L_kept = sum(lr[t] for t in range(T) if kept[t])
        outlier = any(inside[t] and _outside(_exp(_clip(lr[t], -20, 20)), 1e-4, 100.0) for t in range(T))
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
            elif preset == "trl/off-policy-mask":  # δ = 0.5 on sequence-mask: mean(roll − lp) over the sequence
                c = rho_seq if _in(rho_seq, low, high) else 0.0
                kl = sum(roll[i][s] - lp[i][s] for s in range(T) if inside[s]) / max(n, 1)
                if adv[i][t] < 0 and kl > 0.5:
                    c = 0.0
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
            elif preset.startswith("areal/token-mask-kl_"):
                w = _exp(_finite_or_0(lr[t]))
                c = w if _in(_kl(lr[t], preset[-2:]), low, high) else 0.0
            elif preset == "areal/sequence-mask-kl_k3":
                mean_k3 = sum(_kl(lr[s], "k3") for s in range(T) if inside[s]) / max(n, 1)
                c = _exp(_finite_or_0(lr[t])) if _in(mean_k3, low, high) else 0.0
            elif preset == "areal/sequence-mask-max":
                top = max((_finite_or_0(lr[s]) for s in range(T) if inside[s]), default=0.0)
                c = _exp(G_finite) if _in(_exp(top), low, high) else 0.0
            elif preset == "areal/m2po":
                c = 1.0 if (i, t) in m2_kept else 0.0
                red[i][t] = c
            elif preset == "skyrl/geometric":
                c = 0.0 if _outside(_exp(G), low, high) else 1.0
            elif preset == "skyrl/product":
                c = 0.0 if _outside(_exp(L), low, high) else 1.0
            elif preset == "skyrl/outlier-token-is":
                c = 0.0 if outlier else 1.0
            elif preset == "skyrl/tis-sequence-token-mask-is":
                c = min(_exp(_clip(L_kept, -20, 20)), high) if kept[t] else 0.0
            elif preset == "skyrl/geometric-token-mask-is":
                c = 0.0 if not kept[t] or _outside(_exp(L_kept / max(n_kept, 1)), low, high) else 1.0
            elif preset in ("verl/seq-max-k2", "verl/seq-max-k3"):
                k = _k2 if preset.endswith("k2") else _k3
                top = max((k(_clip(lr[s], -20, 20)) for s in range(T) if inside[s]), default=0.0)
                c = 1.0
                if not _in(top, low, high):
                    c, red[i][t] = 0.0, 0.0
            elif preset == "verl/token-tis-batch-norm":
                c = min(_exp(_clip(lr[t], -20, 20)), high)  # divided by the batch mean below
            elif preset == "verl/seq-tis-batch-norm":
                c = min(_exp(_clip(L, -20, 20)), high)
            elif preset == "prime-rl/default":
                c = 1.0
            elif preset.startswith("roll/is-"):
                level = preset.removeprefix("roll/is-")
                w = {"token": r, "segment": _exp(_run_mean(lr, inside, t)), "geometric": rho_geo, "sequence": rho_seq}
                c = min(w[level], high)
            elif preset.startswith(("roll/filter-", "roll/diff-", "roll/ratio-diff-")):
                c = 1.0 if _roll_kept(preset, old[i], roll[i], inside, t, low, high) else 0.0
                red[i][t] = red[i][t] * c
            elif preset == "slime/opsm":
                c = 1.0  # its mask multiplies the loss (ppo_token_mean)
            elif preset == "slime/tis":
                c = _clip(r, low, high)
            elif preset == "slime/icepop":
                c = r if _in(r, low, high) else 0.0
            elif preset.startswith("slime/mis-"):
                c = _slime_mis(preset, lr[t], L, G, inside_lr, low, high, batch_mean)
            else:
                raise KeyError(preset)
            coef[i][t] = c if inside[t] else 0.0
    if preset.endswith("-batch-norm"):  # verl's rollout_is_batch_normalize: mean 1 over the batch
        inside = [(i, t) for i in range(B) for t in range(T) if mask[i][t] == 1]
        if preset.startswith("verl/token"):
            mean = sum(coef[i][t] for i, t in inside) / len(inside) if inside else 0.0
        else:  # one weight per non-empty sequence
            rows = sorted({i for i, _ in inside})
            mean = sum(next(coef[i][t] for j, t in inside if j == i) for i in rows) / len(rows) if rows else 0.0
        if mean > 1e-8:
            coef = [[c / mean for c in row] for row in coef]
    return coef, red


def _k2(x: float) -> float:
    return 0.5 * x * x


def _k3(x: float) -> float:
    return _exp(x) - 1.0 - x


def ppo_token_mean(preset, case, low, high, eps=0.2):
    """Loss and d loss / d log_probs of PPO + token-mean, by hand."""
    lp, old, roll, adv, mask = (
        case[k] for k in ("log_probs", "old_log_probs", "rollout_log_probs", "advantages", "action_mask")
    )
    coef, red = coefficients(preset, old, roll, mask, low, high, lp, adv)
    B, T = len(lp), len(lp[0])
    if preset == "slime/opsm":  # slime's compute_opsm_mask, δ = 1e-4, on the per-token loss
        for i in range(B):
            n = sum(1 for t in range(T) if mask[i][t] == 1)
            drift = sum(old[i][t] - lp[i][t] for t in range(T) if mask[i][t] == 1) / max(n, 1)
            for t in range(T):
                if adv[i][t] < 0 and drift > 1e-4:
                    coef[i][t] = 0.0
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
