"""Loading a framework's pickle-based dump without running its code.

pickle and torch.load call whatever a file names. A dump is read here with:
  .pt    torch.load(weights_only=True): tensors, primitive containers and a few torch types, nothing else;
  .pkl   RestrictedUnpickler: builtins' containers and scalars, collections.OrderedDict, NumPy arrays and torch
         tensors (the storage inside a pickled tensor is itself a torch.save stream, loaded with
         weights_only=True too), plus the reader's stand-ins: inert local objects under a framework's class
         names, so a framework's batch class is rebuilt as plain data without importing the framework.
Anything else is refused with one line naming the file and the type. `--trust` loads with plain pickle.
"""

from __future__ import annotations

import builtins
import io
import pickle
import re
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runner.errors import UserError
from runner.replay.limits import Limits, check_size

TRUST_HINT = "--trust lifts this for a file you made yourself: it then runs whatever code the file holds"

_BUILTINS = {
    "dict",
    "list",
    "tuple",
    "set",
    "frozenset",
    "int",
    "float",
    "complex",
    "str",
    "bytes",
    "bytearray",
    "bool",
    "slice",
    "range",
}


def _storage_from_bytes(data: bytes):
    """torch.storage._load_from_bytes, as a pickled tensor's storage names it, restricted like a .pt file."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _UNSUPPORTED.search(str(exc))
        what = next((g for g in found.groups() if g), "a type") if found else "a type"
        raise Refused(f"refused to load {what} inside a pickled tensor's storage ({TRUST_HINT})") from None


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # NumPy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    return _reconstruct, scalar


def allowed_globals() -> dict[tuple[str, str], Any]:
    """(module, name) → the object a restricted unpickle may build from it."""
    reconstruct, scalar = _numpy_reconstruct()
    allowed: dict[tuple[str, str], Any] = {("builtins", name): getattr(builtins, name) for name in _BUILTINS}
    allowed[("collections", "OrderedDict")] = OrderedDict
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
        allowed[(module, "scalar")] = scalar
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    allowed[("torch._utils", "_rebuild_tensor_v2")] = torch._utils._rebuild_tensor_v2
    allowed[("torch._utils", "_rebuild_tensor")] = torch._utils._rebuild_tensor
    allowed[("torch.storage", "_load_from_bytes")] = _storage_from_bytes
    allowed[("torch", "device")] = torch.device
    allowed[("torch", "Size")] = torch.Size
    return allowed


class Refused(UserError):
    pass


class RestrictedUnpickler(pickle.Unpickler):
    """find_class answers only from the allow-list (and the stand-ins); it never imports a module."""

    def __init__(self, file, source: str, stand_ins: Mapping[tuple[str, str], Any] | None = None):
        super().__init__(file)
        self.source = source
        self.allowed = {**allowed_globals(), **(stand_ins or {})}

    def find_class(self, module: str, name: str):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise Refused(
                f"{self.source}: refused to unpickle {module}.{name}: only tensors, arrays and plain containers "
                f"are loaded ({TRUST_HINT})"
            ) from None

    def persistent_load(self, pid):
        raise Refused(f"{self.source}: refused a persistent id in the pickle ({TRUST_HINT})")


class TrustingUnpickler(pickle.Unpickler):
    """--trust: plain pickle, which imports and calls what the file names; the reader's stand-ins still come
    first, so a framework's batch is read the same way with and without its package installed."""

    def __init__(self, file, stand_ins: Mapping[tuple[str, str], Any] | None = None):
        super().__init__(file)
        self.stand_ins = dict(stand_ins or {})

    def find_class(self, module: str, name: str):
        if (module, name) in self.stand_ins:
            return self.stand_ins[(module, name)]
        return super().find_class(module, name)


def load_pickle(path: Path, limits: Limits, stand_ins: Mapping[tuple[str, str], Any] | None = None) -> Any:
    check_size(path, limits)
    with open(path, "rb") as handle:
        try:
            if limits.trust:
                return TrustingUnpickler(handle, stand_ins).load()
            return RestrictedUnpickler(handle, str(path), stand_ins).load()
        except Refused as exc:
            text = str(exc)
            raise Refused(text if text.startswith(str(path)) else f"{path}: {text}") from None
        except UserError:
            raise
        except ImportError as exc:
            raise UserError(f"{path}: --trust: the pickle needs {exc.name or exc}, which is not installed") from None
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
            raise UserError(f"{path}: not a readable pickle ({type(exc).__name__}: {exc}; a truncated file?)") from None
        except RuntimeError as exc:  # a tensor's storage that torch cannot read
            raise UserError(f"{path}: a tensor in the pickle could not be read ({_first_line(exc)})") from None


_UNSUPPORTED = re.compile(r"GLOBAL ([\w.]+)|global ([\w.]+)")  # the wording differs between torch versions


def load_pt(path: Path, limits: Limits) -> Any:
    check_size(path, limits)
    try:
        if zipfile.is_zipfile(path):  # what the tensors expand to (a .pt is a zip of its storages)
            with zipfile.ZipFile(path) as archive:
                check_size(path, limits, sum(info.file_size for info in archive.infolist()))
        return torch.load(path, map_location="cpu", weights_only=not limits.trust)
    except UserError:
        raise
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = _UNSUPPORTED.search(text)
        what = next((g for g in found.groups() if g), None) if found else None
        if what or "weights_only" in text.lower():
            raise UserError(
                f"{path}: refused to load {what or 'a type'} with torch.load(weights_only=True): only tensors and "
                f"plain containers are loaded ({TRUST_HINT})"
            ) from None
        raise UserError(f"{path}: not a readable .pt file ({_first_line(exc)})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UserError(f"{path}: not a readable .pt file ({_first_line(exc)}; a truncated file?)") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
