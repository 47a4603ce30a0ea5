"""`gpuctl submit --code DIR`: pack the folder and upload it as a code snapshot of the team."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.cli.client import Api
from workers.cli.errors import CliError, UsageError
from workers.cli.output import err
from workers.codepack import CodePackError, CodeTooLarge, PackedCode, human_size, pack
from workers.protocol import CODE_SNAPSHOT_MAX_BYTES

SNAPSHOTS_PATH = "code-snapshots/"
MAX_BYTES = CODE_SNAPSHOT_MAX_BYTES  # the console refuses a bigger archive


def pack_folder(folder: str, *, quiet: bool = False) -> PackedCode:
    """The folder packed, its warnings and a one-line summary on stderr. Past the cap: a usage error (exit 2)."""
    try:
        packed = pack(Path(folder), max_bytes=MAX_BYTES)
    except CodeTooLarge as exc:
        raise UsageError(f"--code {folder}: {exc}") from None
    except CodePackError as exc:
        raise CliError(f"--code {folder}: {exc}") from None
    for warning in packed.warnings:
        err(f"warning: {warning}")
    if not quiet:
        err(f"Packed {folder}: {packed.files} files, {human_size(packed.content_bytes)} "
            f"({human_size(packed.size)} compressed), sha256 {packed.sha256}")
    return packed


def resolve_team(api: Api, team: str | None, why: str) -> str:
    """The team given, or the only one the user holds a role in."""
    if team:
        return team
    slugs = [str(item["slug"]) for item in api.paginate("teams/", limit=101)]
    if len(slugs) == 1:
        return slugs[0]
    if not slugs:
        raise CliError("you hold a role in no team; ask a team manager to add you")
    listed = ", ".join(slugs[:10]) + (", ..." if len(slugs) > 10 else "")
    raise UsageError(f"{why}: give --team (one of {listed})")


def upload(api: Api, packed: PackedCode, team: str, *, quiet: bool = False) -> dict[str, Any]:
    """POST the archive to code-snapshots/; the snapshot the console stored, its digest checked."""
    with packed.path.open("rb") as archive:
        snapshot = api.upload(SNAPSHOTS_PATH, fields={"team": team},
                              files={"archive": ("code.tar.gz", archive, "application/gzip")})
    if not isinstance(snapshot, dict) or not snapshot.get("id"):
        raise CliError(f"{api.endpoint(SNAPSHOTS_PATH)} did not answer a snapshot id")
    stored = snapshot.get("sha256")
    if stored and stored != packed.sha256:
        raise CliError(f"the console stored code snapshot {snapshot['id']} with sha256 {stored}, "
                       f"but gpuctl sent {packed.sha256}: the upload was altered on the way")
    if not quiet:
        err(f"Uploaded code snapshot {snapshot['id']} to team {team}")
    return snapshot
