"""Everything the rules look at, computed once from probe records and raw logs.

:class:`Evidence` is the sources (sources.py: the records, the logs, the step
table, the snapshots, the checks, the losses, the ranks) and one attribute per
facet, each facet a small module of related analyses:

- ``ev.loss``: the loss curves' shapes, per-rank offsets, same-data groups
- ``ev.replicas``: where the replicas parted, the differing tensor, the counters,
  the initial weights
- ``ev.agreement``: the replica-agreement timeline of the parameter checks
- ``ev.placement``: a sharded or hybrid job's replica keys and mesh
- ``ev.fingerprints``: the must-be-equal fingerprints per replica group, long form
- ``ev.reduce``: the gradient reduction (a sum instead of a mean, ranks left out)
- ``ev.numerics``: mixed-precision overflow skips and disagreements
- ``ev.data``: what each rank read (duplicate batches, overlapping sample ids)
- ``ev.events``: communication and process events, failures, hangs, rebuilds
- ``ev.buffers``: buffers nothing keeps in sync
- ``ev.settings``: values every rank must share (the lr, what the logs show shared)
- ``ev.evaluations``: final evaluations that differ across ranks, and the loss gaps' trend

A new fact goes in the facet it belongs to, or in a new facet module with one
line here. Each analysis is a cached property, so a rule that needs nothing from
records costs nothing on a logs-only diagnosis, and 256 ranks × 10,000 steps stay
columnar (polars) from file to finding.
"""

from __future__ import annotations

from functools import cached_property

from syncdoctor.doctor.evidence.agreement import Agreement
from syncdoctor.doctor.evidence.buffers import Buffers
from syncdoctor.doctor.evidence.data import Data
from syncdoctor.doctor.evidence.evaluations import Evaluations
from syncdoctor.doctor.evidence.events import Events
from syncdoctor.doctor.evidence.fingerprints import Fingerprints
from syncdoctor.doctor.evidence.loss import Loss, Offsets
from syncdoctor.doctor.evidence.numerics import Numerics
from syncdoctor.doctor.evidence.placement import Placement
from syncdoctor.doctor.evidence.reduce import Reduce
from syncdoctor.doctor.evidence.replicas import Divergence, Replicas
from syncdoctor.doctor.evidence.settings import Settings
from syncdoctor.doctor.evidence.sources import Facet, Sources, float_of, int_of


class Evidence(Sources):
    """The sources and their facets (each built on first use)."""

    @cached_property
    def loss(self) -> Loss:
        return Loss(self)

    @cached_property
    def placement(self) -> Placement:
        return Placement(self)

    @cached_property
    def fingerprints(self) -> Fingerprints:
        return Fingerprints(self, self.placement)

    @cached_property
    def agreement(self) -> Agreement:
        return Agreement(self)

    @cached_property
    def replicas(self) -> Replicas:
        return Replicas(self, self.placement, self.fingerprints, self.agreement)

    @cached_property
    def reduce(self) -> Reduce:
        return Reduce(self, self.replicas)

    @cached_property
    def numerics(self) -> Numerics:
        return Numerics(self)

    @cached_property
    def data(self) -> Data:
        return Data(self, self.placement)

    @cached_property
    def events(self) -> Events:
        return Events(self)

    @cached_property
    def buffers(self) -> Buffers:
        return Buffers(self)

    @cached_property
    def settings(self) -> Settings:
        return Settings(self)

    @cached_property
    def evaluations(self) -> Evaluations:
        return Evaluations(self, self.loss)


__all__ = ["Divergence", "Evidence", "Facet", "Offsets", "Sources", "float_of", "int_of"]
