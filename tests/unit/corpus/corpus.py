"""The corpus of real public cases: loading, the fixed dev/test split, and the
batch format the cases were entered in.

Each case is two files under ``cases/``: ``<id>.log`` (the verbatim log excerpt,
byte for byte as published) and ``<id>.json`` (source URL, confirmed cause, the
categories an expert would accept, one line of why). The split is a pure
function of the id (``sha256(id) % 3 == 0`` is the test part), fixed once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

CASES_DIR = Path(__file__).parent / "cases"


def split_of(case_id: str) -> str:
    return "test" if int(hashlib.sha256(case_id.encode()).hexdigest(), 16) % 3 == 0 else "dev"


@dataclass
class Case:
    id: str
    url: str
    categories: list[str]  # the first is the confirmed cause's category
    cause: str
    why: str
    confirmed: str  # maintainer | reporter | fix-pr | message | committed-log
    framework: str
    log_path: Path

    @property
    def split(self) -> str:
        return split_of(self.id)

    @property
    def healthy(self) -> bool:
        return self.categories[0] == "healthy"


def load_cases(directory: Path = CASES_DIR) -> list[Case]:
    cases = []
    for meta in sorted(directory.glob("*.json")):
        data = json.loads(meta.read_text(encoding="utf-8"))
        cases.append(
            Case(
                id=meta.stem,
                url=data["url"],
                categories=list(data["categories"]),
                cause=data["cause"],
                why=data["why"],
                confirmed=data["confirmed"],
                framework=data["framework"],
                log_path=meta.with_suffix(".log"),
            )
        )
    return cases


def import_batch(text: str, directory: Path = CASES_DIR) -> list[str]:
    """Write the cases of one batch file: blocks that start with ``=== <id>``,
    then ``key: value`` lines, then a line ``---``, then the verbatim log up to
    the next ``=== `` line (a trailing blank line is dropped)."""
    written = []
    blocks = text.split("\n=== ")
    for block in blocks:
        block = block.removeprefix("=== ")
        if not block.strip():
            continue
        head, _, log = block.partition("\n---\n")
        lines = head.splitlines()
        case_id = lines[0].strip()
        meta: dict[str, object] = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            meta[key.strip()] = value.strip()
        meta["categories"] = [c.strip() for c in str(meta["categories"]).split(",")]
        meta["split"] = split_of(case_id)
        for key in ("url", "cause", "why", "confirmed", "framework"):
            if not meta.get(key):
                raise ValueError(f"{case_id}: missing {key}")
        (directory / f"{case_id}.log").write_text(log.rstrip("\n") + "\n", encoding="utf-8")
        (directory / f"{case_id}.json").write_text(
            json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        written.append(case_id)
    return written


def table_markdown(cases: list[Case]) -> str:
    """The corpus as a markdown table (one row per case), for docs/corpus.md."""
    rows = [
        "| case | split | framework | confirmed category (accepted) | confirmed by | source | why |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in sorted(cases, key=lambda c: (c.categories[0], c.id)):
        accepted = c.categories[0] + (f" ({', '.join(c.categories[1:])})" if len(c.categories) > 1 else "")
        why = c.why.replace("|", "\\|")
        rows.append(f"| `{c.id}` | {c.split} | {c.framework} | {accepted} | {c.confirmed} | [link]({c.url}) | {why} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--table"]:
        print(table_markdown(load_cases()), end="")
    for path in sys.argv[1:]:
        if path != "--table":
            ids = import_batch(Path(path).read_text(encoding="utf-8"))
            print(f"{path}: {len(ids)} cases")
