"""What a session's sandboxes could reach (mounts, the %pip policy), recorded in the journal's
header and the notebook's metadata, read back as untrusted, and what a replay lacks of it said up
front and as a failing cell's hint (issue 23). No sandbox: records and judging only."""

from __future__ import annotations

import json
from pathlib import Path

from kernelbridge.config import Mount, PackageSettings, Settings
from kernelbridge.notebook.access import SandboxAccess
from kernelbridge.notebook.convert import notebook_access
from kernelbridge.notebook.displays import journal_entries
from kernelbridge.notebook.journal import Journal, JournalCell, JournalHeader
from kernelbridge.replay.judge import CellVerdict, behaviour, judge, lacking_notes, with_hint
from kernelbridge.testing.notebooks import journal_to_notebook


def error(ename: str, evalue: str) -> dict[str, object]:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": []}


def test_the_header_and_the_notebook_record_the_mount_targets_and_the_policy_never_host_paths(
    tmp_path: Path,
) -> None:
    settings = Settings(
        state_dir=tmp_path,
        mounts=(Mount(tmp_path / "secret-host-path", "/data"),),
        packages=PackageSettings(policy="names", allowed=frozenset({"polars", "six"})),
    )
    access = SandboxAccess.of(settings)
    journal = Journal(tmp_path / "s.journal.jsonl", budget=1 << 20)
    journal.start(JournalHeader("s", 1.0, 1, 0, access))
    journal.append(JournalCell(code="1"))
    header = json.loads((tmp_path / "s.journal.jsonl").read_text().splitlines()[0])
    assert header["sandbox"] == {"mounts": ["/data"], "packages": ["polars", "six"]}
    nb = journal_to_notebook(journal_entries(tmp_path / "s.journal.jsonl"), "s")
    assert nb.metadata["kernelbridge"]["sandbox"] == header["sandbox"]
    assert "secret-host-path" not in json.dumps(nb)
    assert notebook_access(nb) == access


def test_a_notebooks_record_is_untrusted() -> None:
    hostile = {
        "mounts": ["/data", 7, "relative", "/" + "x" * 5000, "/bad\nline", *[f"/m{i}" for i in range(100)]],
        "packages": ["ok-name", "--index-url", 3, "UPPER"],
    }
    access = SandboxAccess.from_json(hostile)
    assert access is not None and access.mounts[0] == "/data" and len(access.mounts) <= 64
    assert all(m.isprintable() and len(m) < 1025 for m in access.mounts)
    assert access.packages == "names" and access.allowed == ("ok-name",)
    assert SandboxAccess.from_json({"packages": "everything"}) == SandboxAccess()
    assert SandboxAccess.from_json("nope") is None


def test_a_replay_says_what_it_lacks_and_a_failing_cell_gets_the_hint() -> None:
    original = SandboxAccess(("/data", "/models"), "any")
    lacking = original.lacks(SandboxAccess(("/models",), "none"))
    assert lacking.mounts == ("/data",) and lacking.packages == ("any",)
    notes = lacking_notes(lacking)
    assert notes[0].startswith("the original session had a host directory mounted on /data")
    assert "KERNELBRIDGE_MOUNTS=SRC:/data" in notes[0] and "allows none" in notes[1]
    missing = behaviour(
        [error("FileNotFoundError", "[Errno 2] No such file or directory: '/data/sales.csv'")]
    )
    verdict = with_hint(judge(2, behaviour([]), missing), missing, lacking)
    assert verdict.why.endswith("(the original had /data mounted; this replay does not)"), verdict.why
    # A path elsewhere, or a replay that lacks nothing, gets no false hint.
    other = behaviour([error("FileNotFoundError", "[Errno 2] No such file or directory: '/database'")])
    assert with_hint(judge(2, behaviour([]), other), other, lacking).why.endswith(
        "(the original had /data mounted; this replay does not)"
    )  # no path matched: every missing mount is named
    complete = original.lacks(original)
    assert not complete and lacking_notes(complete) == []
    assert with_hint(judge(2, behaviour([]), missing), missing, complete) == judge(2, behaviour([]), missing)
    module = behaviour([error("ModuleNotFoundError", "No module named 'polars'")])
    assert "%pip install" in with_hint(judge(3, behaviour([]), module), module, lacking).why
    same = CellVerdict(4, "same")
    assert with_hint(same, behaviour([]), lacking) == same
