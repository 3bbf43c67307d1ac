from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.must_equal import describe
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import describe_split

# What launchers and communicators say when the job's layout is wrong.
_LAUNCH_WORDS = {
    "role name": "the process has no valid cluster role (started without the launcher that sets it)",
    "could be redundant": "more processes joined the cluster than the configured worker count",
    "been using by other process": "the communicator's port is held by another process",
    "address already in use": "the rendezvous/communicator port is held by another process",
    "rank table": "the rank table (cluster layout file) is invalid",
    "ranktable": "the rank table (cluster layout file) is invalid",
    "rank_table": "the rank table (cluster layout file) is invalid",
    "ei0004": "HCCL rejected the rank table or the cluster configuration (EI0004)",
    "hccn_tool": "the rank-table generator cannot read the NPUs' network addresses",
    "hccn.conf": "the rank-table generator cannot read the NPUs' network addresses",
    "trying to connect to": "the workers cannot reach the rendezvous store at the configured master address/port",
    "failed to connect to": "the workers cannot reach the rendezvous store at the configured master address/port",
    "rendezvousconnectionerror": "the workers cannot reach the rendezvous endpoint",
    "no socket interface found": "the socket-interface setting (NCCL_SOCKET_IFNAME) matches no usable interface",
    "name does not resolve": "the master's host name does not resolve",
    "can't resolve": "the master's host name does not resolve",
}

# Connection attempts that a launcher retries: a launch fault only if training never began.
_TRANSIENT = {"trying to connect to", "failed to connect to", "rendezvousconnectionerror"}


class LaunchConfiguration(Rule):
    """The job's layout is wrong: roles, node counts, rank table, ports.

    **Symptom:** the job fails at start-up with a cluster or rank-table error:
    MindSpore's "Role name '' is invalid" or "This node could be redundant",
    HCCL's EI0004 / a rank table with invalid entries, "Address already in use",
    HCCL failing to listen on a port another process holds. Communication errors
    that follow are consequences.

    **Cause:** the launch configuration: the process was not started by the
    launcher that sets its role, more workers than configured, a rank table that
    does not describe the machines (device IPs, server count), a port in use.

    From per-rank logs: the world size each rank prints at start differs.

    **Quick check:** compare the launcher's worker count, MS_ROLE/RANK_TABLE_FILE,
    MASTER_ADDR/PORT and the rank table with the machines actually used
    (`syncdoctor preflight` checks rank tables).

    **Fix:** launch with msrun/mpirun/torchrun as documented, make the worker counts
    match, regenerate the rank table from the real hosts (device IPs from `hccn_tool`),
    and free or change the port.
    """

    code = "SD203"
    name = "launch-configuration"
    category = "config.launch"
    stage = "launch"
    title = "The job's launch configuration is wrong"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        hits: list[tuple[str, str]] = []
        ranks: set[int] = set()
        # Launchers retry their first connections while the others start (msrun,
        # torchrun): a job that went on to train got through, and those lines were noise.
        trained = ev.has_records or ev.losses.height > 0
        for event in ev.events.of("configuration"):
            low = event.raw.lower()
            word = next((w for w in _LAUNCH_WORDS if w in low), None)
            if word is None or (trained and word in _TRANSIENT):
                continue
            meaning = _LAUNCH_WORDS[word]
            hits.append((meaning, f"{event.source}:{event.line}: {event.raw[:200]}"))
            if event.rank is not None:
                ranks.add(event.rank)
        size = ev.settings.log_partings.get("size")
        if size is not None:
            hits.append(
                (
                    "the ranks were launched as parts of jobs of different sizes: " + describe(size, describe_split),
                    f"{size.where}",
                )
            )
        if not hits:
            return None
        meanings = list(dict.fromkeys(m for m, _ in hits))
        return self.found(0.85, meanings[:2] + [line for _, line in hits[:3]], ranks=sorted(ranks))
