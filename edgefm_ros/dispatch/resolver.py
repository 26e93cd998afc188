"""One place that turns a mode and a machine into the dispatch tables and the resolver every engine uses.

Load order (later records outrank earlier ones of equal specificity):
  1. the built-in tables of the mode (``dispatch.builtin_tables``);
  2. the mode's skills whose requirements hold here (``skills.tables_for``; none in reference mode);
  3. this machine's tuned table ``config/dispatch/<hw_profile>.yaml`` (fast mode, when ``use_tuned``);
  4. the caller's tables, then its extra records (e.g. a forced KV codec).
The tuned table is machine-made: where one of its records cannot serve here the op resolves without it
(``OpResolver.fallback``), so the fallback table is the same list without the tuned file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from . import skills
from .table import OpResolver, Record, Table, builtin_tables, load_table, read_yaml
from .modes import check_mode


def tuned_table_path(hw_profile: str) -> Path:
    """config/dispatch/<hw_profile>.yaml of the source tree or installed share dir."""
    here = Path(__file__).resolve()
    for root in (here.parents[2], here.parents[1]):
        p = root / "config" / "dispatch" / f"{hw_profile}.yaml"
        if p.is_file():
            return p
    return here.parents[2] / "config" / "dispatch" / f"{hw_profile}.yaml"


def tuned_elsewhere(path: Path, hardware) -> str | None:
    """Why the tuned table at ``path`` may not fit ``hardware`` (a dispatch.hardware.Hardware): it records the
    machine it was measured on, and a table from another CPU (or thread count) still serves wherever its
    impls run, but its choices were timed there (bf16 GEMMs chosen on AMX ran at half the fp32 rate on a CPU
    without it). None when it was tuned here, or when it records no machine."""
    meta = read_yaml(Path(path), "tuned table") or {}
    hw = meta.get("hw") if isinstance(meta, dict) else None
    if not isinstance(hw, dict) or "fingerprint" not in hw or hw["fingerprint"] == hardware.fingerprint:
        return None
    return (f"tuned on another machine ({hw.get('name', '?')}, {hw.get('threads', '?')} threads, fingerprint "
            f"{hw['fingerprint']}; this one: {hardware.name}, {hardware.threads} threads, {hardware.fingerprint}): "
            f"its choices were timed there; run `edgefm-vla tune` on this machine")


def table_files(mode: str, hw_profile: str, tables: Sequence[str | Path] = (), use_tuned: bool = True
                ) -> tuple[list[Path], Path | None]:
    """(the table files of ``mode`` on ``hw_profile`` in load order, the tuned one among them or None)."""
    mode = check_mode(mode)
    files = builtin_tables(mode)
    if mode != "reference":  # the mode's skills whose requirements are met here
        files += skills.tables_for(hw_profile, mode=mode)
    tuned = tuned_table_path(hw_profile)
    if not (mode == "fast" and use_tuned and tuned.is_file()):
        tuned = None
    if tuned is not None:
        files.append(tuned)
    return files + [Path(t) for t in tables], tuned


def build_resolver(mode: str, hw_profile: str, model: str, stage_of: Callable[[str], str],
                   tables: Sequence[str | Path] = (), use_tuned: bool = True,
                   extra: Sequence[Record] = ()) -> OpResolver:
    """The resolver of ``model`` in ``mode`` on ``hw_profile`` (see the module docstring for the tables).

    ``resolver.files`` lists the table files loaded, ``resolver.tuned`` the tuned one (or None).
    """
    files, tuned = table_files(mode, hw_profile, tables, use_tuned)
    parsed = {f: load_table(f) for f in files}  # each file once
    records = [r for f in files for r in parsed[f]] + list(extra)
    fallback = Table([r for f in files if f != tuned for r in parsed[f]] + list(extra)) if tuned else None
    return OpResolver(Table(records), hw_profile, model, stage_of, fallback, files, tuned)


__all__ = ["build_resolver", "table_files", "tuned_table_path"]
