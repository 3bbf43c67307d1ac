"""The Evidence's facets (doctor/evidence/): every facet module is wired into
`Evidence`, builds on the sources and other facets only (never on the package that
assembles them), and every fact of every facet answers on evidence that holds
nothing, on a logs-only run and on a records run, without raising."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from functools import cached_property
from pathlib import Path

import pytest

from syncdoctor.doctor import evidence as evidence_package
from syncdoctor.doctor.diagnose import load_evidence
from syncdoctor.doctor.evidence import Evidence, Facet

TESTS = Path(__file__).resolve().parents[2]
FACET_MODULES = [m.name for m in pkgutil.iter_modules(evidence_package.__path__) if m.name != "sources"]


def _facet_class(module_name: str) -> type[Facet]:
    module = importlib.import_module(f"{evidence_package.__name__}.{module_name}")
    classes = [
        c
        for c in vars(module).values()
        if inspect.isclass(c) and issubclass(c, Facet) and c.__module__ == module.__name__
    ]
    assert len(classes) == 1, f"{module_name}: one Facet subclass per module, found {classes}"
    return classes[0]


@pytest.mark.parametrize("module_name", FACET_MODULES)
def test_every_facet_module_is_an_attribute_of_the_evidence(module_name: str) -> None:
    cls = _facet_class(module_name)
    assert isinstance(getattr(Evidence(), module_name), cls)


@pytest.mark.parametrize("module_name", [*FACET_MODULES, "sources"])
def test_a_facet_never_imports_the_package_that_assembles_the_facets(module_name: str) -> None:
    path = Path(evidence_package.__path__[0]) / f"{module_name}.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            assert node.module != evidence_package.__name__, f"{module_name}.py imports the Evidence package"


def _facts(ev: Evidence) -> dict[str, object]:
    """Every cached property of every facet, read."""
    out: dict[str, object] = {}
    for module_name in FACET_MODULES:
        facet = getattr(ev, module_name)
        for name, member in vars(type(facet)).items():
            if isinstance(member, cached_property) and not name.startswith("_"):
                out[f"{module_name}.{name}"] = getattr(facet, name)
    return out


@pytest.mark.parametrize(
    "inputs",
    [[], [TESTS / "fixtures" / "logs" / "oom_crash.log"], [TESTS / "rules" / "SD401" / "fire"]],
    ids=["empty", "logs", "records"],
)
def test_every_fact_answers_whatever_the_evidence_holds(inputs: list[Path]) -> None:
    ev = load_evidence(inputs) if inputs else Evidence()
    facts = _facts(ev)
    assert len(facts) >= 30
    if not inputs:
        assert facts["replicas.divergence"] is None and facts["events.all"] == [] and facts["loss.mean_shape"] is None
    elif inputs[0].is_dir():
        assert facts["replicas.divergence"] is not None  # SD401's fire case: the replicas part
    else:
        assert facts["events.first_failure"] is not None and facts["replicas.divergence"] is None
