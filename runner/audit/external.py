"""An external target as the user describes it on the command line (`TargetSpec`), and how it is
turned into an audit subject. Every way this can go wrong is a `UserError` of one line (exit code
2); the calling conventions are in runner/audit/conventions.py, the loading in runner/audit/loading.py.

Keyword arguments (`--target-kwargs`, `--call-kwargs`, `--weights-kwargs`) are JSON objects; a
value that is an object with a `_target_` key is built with Hydra's instantiate, after the target
is loaded, so `{"config": {"_target_": "verl.workers.config.ActorConfig", ...}}` gives verl's loss
its real config class.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from runner.audit.loading import first_line, install_stubs, load_attr, parse_stubs
from runner.bounded import load_json
from runner.errors import UserError


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = load_json(text, flag)  # refused past runner.bounded's element cap
    except json.JSONDecodeError as exc:
        raise UserError(f"{flag} is not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise UserError(f"{flag} must be a JSON object, got {type(value).__name__}")
    return value


def instantiate_values(kwargs: Mapping[str, Any], flag: str) -> dict[str, Any]:
    """Values of the form {"_target_": "pkg.Class", ...} → pkg.Class(...) (Hydra's instantiate)."""

    def wanted(v: Any) -> bool:
        return isinstance(v, dict) and "_target_" in v

    if not any(wanted(v) for v in kwargs.values()):
        return dict(kwargs)
    from runner.hydra_app.app import instantiate

    out = {}
    for key, value in kwargs.items():
        if wanted(value):
            try:
                value = instantiate(value)
            except Exception as exc:  # noqa: BLE001 - the user's class, the user's error
                cause = exc.__cause__ or exc
                raise UserError(
                    f"{flag}: building {key} from {value['_target_']} failed ({first_line(cause)})"
                ) from None
        out[key] = value
    return out


def parse_band(text: str | None) -> tuple[float | None, float | None] | None:
    if text is None or not text.strip():
        return None
    low, sep, high = text.partition(",")
    try:
        out = (float(low) if low.strip() else None, float(high) if high.strip() else None)
    except ValueError:
        out = None
    if not sep or out is None or out == (None, None):
        raise UserError(f"--band must be LOW,HIGH (either may be empty, e.g. ',2'), got {text!r}")
    return out


@dataclass(frozen=True)
class TargetSpec:
    """Everything that says what an external target is and how it is called."""

    target: str | None = None  # module:attr or path/to/file.py:attr; None: --weights-fn with our loss
    target_kwargs: str | None = None  # JSON: constructor kwargs of a class, extra kwargs of a function
    stub: tuple[str, ...] = ()
    convention: str = "openrlhf"
    arg_map: str | None = None
    loss_key: str | None = None
    call_kwargs: str | None = None  # JSON: forward-time kwargs
    weights_fn: str | None = None
    weights_kwargs: str | None = None  # JSON
    band: str | None = None  # "LOW,HIGH": the bounds of the weights function's kept coefficients
    allow_raise: tuple[str, ...] = ()

    FLAGS = {
        "target": "--target",
        "target_kwargs": "--target-kwargs",
        "stub": "--stub",
        "convention": "--convention",
        "arg_map": "--arg-map",
        "loss_key": "--loss-key",
        "call_kwargs": "--call-kwargs",
        "weights_fn": "--weights-fn",
        "weights_kwargs": "--weights-kwargs",
        "band": "--band",
        "allow_raise": "--allow-raise",
    }

    @classmethod
    def of(cls, **values: Any) -> TargetSpec:
        """From CLI values: comma-separated or repeated lists, None for anything not given."""
        clean = {k: v for k, v in values.items() if v is not None}
        for key in ("stub", "allow_raise"):
            if key in clean:
                clean[key] = tuple(parse_stubs(clean[key]))
        return cls(**clean)

    @property
    def given(self) -> bool:
        return self.target is not None or self.weights_fn is not None

    def to_dict(self) -> dict[str, Any]:
        """The non-default fields, as written into a case file's `target:` block."""
        default = TargetSpec()
        return {
            f.name: (list(v) if isinstance(v, tuple) else v)
            for f in fields(self)
            if (v := getattr(self, f.name)) != getattr(default, f.name)
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> TargetSpec:
        if not isinstance(data, Mapping):
            raise UserError(f"{where}: `target:` must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"{where}: unknown key(s) in `target:`: {', '.join(unknown)}")
        return cls.of(**dict(data))

    def digest(self) -> str:
        """8 hex digits over everything but the target's name: two audits of one target with
        other kwargs write other case files."""
        body = {k: v for k, v in asdict(self).items() if k not in ("target", "stub", "allow_raise")}
        if self.weights_fn:  # by name: the folder it was unpacked into is not part of what it is
            where, _, attr = self.weights_fn.rpartition(":")
            body["weights_fn"] = f"{Path(where).name}:{attr}"
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:8]

    def cli_args(self) -> list[str]:
        out: list[str] = []
        for key, value in self.to_dict().items():
            out += [self.FLAGS[key], ",".join(value) if isinstance(value, list) else str(value)]
        return out

    def command_line(self) -> str:
        return " ".join(shlex.quote(a) for a in self.cli_args())

    def validate(self) -> None:
        if not self.given:
            extra = [self.FLAGS[k] for k in self.to_dict()]
            if extra:
                raise UserError(f"{extra[0]} needs --target (or --weights-fn)")


def _display_name(spec: str, obj: Any) -> str:
    """`module:attr` as the user would import it, for a file target too."""
    where, _, attr = spec.rpartition(":")
    module = getattr(obj, "__module__", None) or where
    if where.endswith(".py") or "/" in where:
        return f"{module}:{attr}"
    return spec


def _callable(spec: str, obj: Any, kwargs: dict[str, Any], flag: str):
    attr = spec.rpartition(":")[2]
    if not callable(obj):
        raise UserError(f"{flag} {spec}: {attr} is not callable ({type(obj).__name__}); expected a class or a function")
    if inspect.isclass(obj):
        try:
            fn = obj(**kwargs)
        except Exception as exc:  # noqa: BLE001 - the target is the user's code: any failure is its own
            raise UserError(f"{flag} {spec}: {attr}(**kwargs) failed ({first_line(exc)})") from None
        if not callable(fn):
            raise UserError(f"{flag} {spec}: an instance of {attr} is not callable")
        return fn
    return functools.partial(obj, **kwargs) if kwargs else obj


def resolve(spec: TargetSpec | str, kwargs_json: str | None = None, loss_spec=None):
    """A TargetSpec (or, as before, `module:attr` and its kwargs JSON) → ExternalSubject. A
    weights function without a target is composed with `loss_spec` (one of our losses)."""
    from runner.audit.conventions import Caller
    from runner.audit.subjects import Batch, ExternalSubject, SubjectRaised

    if isinstance(spec, str):
        spec = TargetSpec(target=spec, target_kwargs=kwargs_json)
    spec.validate()
    install_stubs(spec.stub)
    target_kwargs = parse_json_object(spec.target_kwargs, "--target-kwargs")
    call_kwargs = parse_json_object(spec.call_kwargs, "--call-kwargs")
    weights_kwargs = parse_json_object(spec.weights_kwargs, "--weights-kwargs")
    band = parse_band(spec.band)
    fn = weights = None
    names = []
    if spec.target is not None:
        obj = load_attr(spec.target, "--target")
        names.append(_display_name(spec.target, obj))
    if spec.weights_fn is not None:
        wobj = load_attr(spec.weights_fn, "--weights-fn")
        names.append(_display_name(spec.weights_fn, wobj))
        weights = _callable(
            spec.weights_fn, wobj, instantiate_values(weights_kwargs, "--weights-kwargs"), "--weights-fn"
        )
    if spec.target is not None:
        fn = _callable(spec.target, obj, instantiate_values(target_kwargs, "--target-kwargs"), "--target")
    elif spec.target_kwargs or spec.call_kwargs:
        raise UserError("--target-kwargs and --call-kwargs need --target")
    caller = Caller.build(
        spec.convention, spec.arg_map, spec.loss_key, instantiate_values(call_kwargs, "--call-kwargs")
    )
    if weights is not None and fn is not None and not caller.takes_weights:
        raise UserError(
            f"--weights-fn: the {spec.convention} convention passes no weights to the loss; "
            "name its parameter with --arg-map weights=NAME"
        )
    if band is not None and weights is None:
        raise UserError("--band bounds the coefficients of --weights-fn; give --weights-fn")
    subject = ExternalSubject(names[0], fn, caller, weights, band, loss_spec if fn is None else None)
    subject.target_spec = spec
    # One benign call up front: a target that cannot take the convention is bad input, not a finding.
    probe = Batch.of([[-0.5, -1.0]], [[-0.6, -1.0]], [[-0.7, -0.9]], [[1.0, -1.0]], [[1, 1]])
    try:
        subject(probe)
    except SubjectRaised as raised:
        what = spec.target or spec.weights_fn
        raise UserError(
            f"{what}: calling it as {caller.describe()} under the {spec.convention} convention "
            f"failed on a benign batch ({first_line(raised.error)})"
        ) from None
    return subject


def resolve_all(spec: TargetSpec, loss_specs: Sequence = ()) -> list:
    """The subjects of one table row: the target, or the weights function under each of our losses."""
    if spec.target is not None:
        return [resolve(spec)]
    return [resolve(spec, loss_spec=s) for s in loss_specs]
