from __future__ import annotations

from collections import defaultdict

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.ingest.meaning import duplicate_device
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

_DEVICE_WORDS = (
    "already in use",
    "is busy",
    "device busy",
    "invalid device",
    "no cuda gpus",
    "device_id",
    "device id",
    "duplicate gpu",
    # HCCP cannot start: the NPU is still held by an earlier process (EJ0001)
    "ej0001",
    "last training process is running",
)
# Ports, not devices: "Address already in use" is a launch problem (SD203).
_NOT_DEVICE = ("address already in use", " port ", "port[", "port:")


class DeviceCollision(Rule):
    """Two ranks on one host drive the same device.

    **Symptom:** start-up errors such as "device already in use", or two ranks on
    one host sharing one card and running at half speed.

    **Cause:** DEVICE_ID / LOCAL_RANK / CUDA_VISIBLE_DEVICES copied between processes
    instead of derived from the local rank.

    **Quick check:** `npu-smi info` / `nvidia-smi` during start-up; print DEVICE_ID per process.

    **Fix:** derive the device from the local rank: `torch.cuda.set_device(local_rank)`,
    `ms.set_context(device_id=int(os.environ["DEVICE_ID"]))` with DEVICE_IDs unique per
    host; check the rank table's device_id entries.
    """

    code = "SD202"
    name = "device-collision"
    category = "env.device"
    stage = "launch"
    title = "Two ranks use the same device"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence: list[str] = []
        ranks: set[int] = set()
        for var in ("DEVICE_ID", "CUDA_VISIBLE_DEVICES", "ASCEND_DEVICE_ID"):
            seen: dict[tuple[str, str], list[int]] = defaultdict(list)
            for rank, snap in ev.snapshots.items():
                value = (snap.get("env") or {}).get(var)
                # A whole device list visible to every rank is normal; one device each must differ.
                if value is not None and "," not in value:
                    seen[(snap.get("host", ""), value)].append(rank)
            for (host, value), owners in seen.items():
                if len(owners) > 1:
                    evidence.append(f"{var}={value} on {fmt_ranks(owners)} of host {host or '?'}")
                    ranks.update(owners)
        shared: dict[str, set[int]] = defaultdict(set)
        for event in ev.events.of("configuration"):
            low = event.raw.lower()
            if any(word in low for word in _DEVICE_WORDS) and not any(w in low for w in _NOT_DEVICE):
                evidence.append(f"{event.source}:{event.line}: {event.raw[:200]}")
                if (dup := duplicate_device(event.raw)) is not None:
                    shared[dup[2]].update(dup[:2])
                elif event.rank is not None:
                    ranks.add(event.rank)
        for device, sharing in shared.items():
            # NCCL's own account of the rank-to-device mapping: two ranks, one GPU.
            evidence.insert(
                0,
                f"NCCL: {fmt_ranks(sharing)} are all on CUDA device {device}: several processes "
                "drive one GPU (device chosen without the local rank)",
            )
            ranks.update(sharing)
        if not evidence:
            return None
        return self.found(0.9 if shared else 0.85, evidence[:8], ranks=sorted(ranks))
