"""Read an offline W&B run's `.wandb` file: wandb 0.31 ships no reader of it (`wandb sync --view` was removed,
and the offline-run reader, wandb.beta.LocalApi, is not released), so this reads the documented container
(LevelDB's log format: 32 KiB blocks of records with a 7-byte header, after a 7-byte ":W&B" file header)
and decodes each record with wandb's own protobuf message, wandb.proto.wandb_internal_pb2.Record."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
FILE_HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic 0xBEE1, a version byte
RECORD_HEADER = struct.Struct("<IHB")  # checksum, length, type (1 full, 2 first, 3 middle, 4 last)


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = FILE_HEADER.unpack_from(data, 0)
    assert (ident, magic) == (b":W&B", 0xBEE1), (ident, magic, version)
    pos, pending = FILE_HEADER.size, b""
    while pos + RECORD_HEADER.size <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < RECORD_HEADER.size:  # a block's tail too short for a header is padding
            pos += left_in_block
            continue
        _, length, kind = RECORD_HEADER.unpack_from(data, pos)
        pos += RECORD_HEADER.size
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(path: Path) -> dict[int, dict[str, object]]:
    """{step: {key: value}} of every history record (the keys wandb adds, _step and so on, left out)."""
    out: dict[int, dict[str, object]] = {}
    for record in records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        step = int(row.pop("_step"))
        out[step] = {k: v for k, v in row.items() if not k.startswith("_")}
    return out


def run_record(path: Path):
    """The run's RunRecord: its name, group, config."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run
    raise AssertionError(f"no run record in {path}")


def config(path: Path) -> dict[str, object]:
    return {
        item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in run_record(path).config.update
    }
