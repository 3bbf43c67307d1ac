"""HCCL rank tables (hccl.json / RANK_TABLE_FILE) read into one shape.

Formats understood:
  * version 1.0 / 1.2 / 2.0: `server_count`, `server_list[].device[]` with `device_id`,
    `device_ip`, `rank_id` (1.2 adds `super_device_id` and `super_pod_list`);
  * the global rank table: `server_group_list[]`, each with its own `server_count`
    and `server_list` (rank ids are numbered per group);
  * the older 0.x form: `group_list[]` with `server_num` and `instance_list[]`, each
    instance a `rank_id`, a `server_id` and `devices[]`.
Values are strings in every format; they are kept as the file spells them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncdoctor.preflight.jsonpos import LineIndex, loads_with_positions

RANK_TABLE_KEYS = ("server_list", "group_list", "server_group_list")

Pos = tuple[int, int]


@dataclass
class Device:
    server: str  # server_id of the server holding it
    rank_id: Any
    device_id: Any
    device_ip: Any
    pos: Pos  # the device entry
    key_pos: dict[str, Pos] = field(default_factory=dict)

    def at(self, key: str) -> Pos:
        return self.key_pos.get(key, self.pos)


@dataclass
class Server:
    server_id: str
    pos: Pos
    devices: list[Device] = field(default_factory=list)


@dataclass
class Group:
    """One communication domain: rank ids are unique and contiguous within it."""

    label: str  # "" for a plain table, "group 2" inside a global rank table
    server_count: Any  # as declared; None when the format has none
    server_count_pos: Pos
    servers: list[Server] = field(default_factory=list)

    @property
    def devices(self) -> list[Device]:
        return [d for s in self.servers for d in s.devices]

    def where(self) -> str:
        return f" in {self.label}" if self.label else ""


@dataclass
class RankTable:
    path: str
    version: str | None
    status: Any
    status_pos: Pos
    groups: list[Group]

    @property
    def device_count(self) -> int:
        return sum(len(g.devices) for g in self.groups)


class RankTableError(ValueError):
    """Not readable as a rank table; `pos` is where the reading stopped."""

    def __init__(self, message: str, pos: Pos = (1, 1)) -> None:
        super().__init__(message)
        self.pos = pos


def looks_like_rank_table(text: str) -> bool:
    """Cheap content sniff for JSON files found while walking folders."""
    return any(f'"{key}"' in text for key in RANK_TABLE_KEYS)


def load_rank_table(path: str | Path) -> RankTable:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        data, idx = loads_with_positions(text)
    except json.JSONDecodeError as exc:
        raise RankTableError(f"malformed JSON: {exc.msg}", (exc.lineno, exc.colno)) from None
    if not isinstance(data, dict) or not any(k in data for k in RANK_TABLE_KEYS):
        raise RankTableError("not a rank table: expected a JSON object with one of " + ", ".join(RANK_TABLE_KEYS))
    if "server_group_list" in data:
        groups = [
            _server_list_group(g, idx, f"group {g.get('group_id', i)}")
            for i, g in enumerate(_objects(data, "server_group_list", idx))
        ]
    elif "server_list" in data:
        groups = [_server_list_group(data, idx, "")]
    else:
        groups = [
            _instance_list_group(g, idx, f"group {g.get('group_name') or i}")
            for i, g in enumerate(_objects(data, "group_list", idx))
        ]
    return RankTable(
        path=str(path),
        version=data.get("version"),
        status=data.get("status"),
        status_pos=idx.key_position(data, "status"),
        groups=groups,
    )


def _objects(parent: dict, key: str, idx: LineIndex) -> list[dict]:
    items = parent.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise RankTableError(f'"{key}" must be a list of objects', idx.key_position(parent, key))
    return items


def _device(server: str, entry: dict, idx: LineIndex, rank_id: Any = None) -> Device:
    keys = ("rank_id", "device_id", "device_ip")
    return Device(
        server=server,
        rank_id=entry.get("rank_id", rank_id),
        device_id=entry.get("device_id"),
        device_ip=entry.get("device_ip"),
        pos=idx.key_position(entry, "device_id"),
        key_pos={k: idx.key_position(entry, k) for k in keys if k in entry},
    )


def _server_list_group(parent: dict, idx: LineIndex, label: str) -> Group:
    group = Group(label, parent.get("server_count"), idx.key_position(parent, "server_count"))
    for i, srv in enumerate(_objects(parent, "server_list", idx)):
        server_id = str(srv.get("server_id", f"#{i}"))
        server = Server(server_id, idx.key_position(srv, "server_id"))
        server.devices = [_device(server_id, d, idx) for d in _objects(srv, "device", idx)]
        group.servers.append(server)
    return group


def _instance_list_group(parent: dict, idx: LineIndex, label: str) -> Group:
    group = Group(label, parent.get("server_num"), idx.key_position(parent, "server_num"))
    by_id: dict[str, Server] = {}
    for inst in _objects(parent, "instance_list", idx):
        server_id = str(inst.get("server_id", "?"))
        server = by_id.get(server_id)
        if server is None:
            server = by_id[server_id] = Server(server_id, idx.key_position(inst, "server_id"))
            group.servers.append(server)
        for d in _objects(inst, "devices", idx):
            server.devices.append(_device(server_id, d, idx, inst.get("rank_id")))
    return group


def as_int(value: Any) -> int | None:
    """Rank-table numbers are strings; None when the value is not a whole number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None
