"""Reading a W&B offline run back without a server (tests only): the history rows of its
``run-<id>.wandb`` file, with W&B's own ``Record`` protobuf (``wandb.proto``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def read_wandb_history(run_file: Path) -> list[dict]:
    """The history rows of a W&B offline run file (``run-<id>.wandb``): a LevelDB-style log (a
    7-byte header ``:W&B`` + magic + version, then 32 KiB blocks of records, each a 7-byte header
    crc32 / length / type: 1 full, 2 first, 3 middle, 4 last) of W&B ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, chunk, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            break
        chunk += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(chunk)
            chunk = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return rows
