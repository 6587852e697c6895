"""The demo's Python step: catalogues each archived delivery.

It reads two earlier steps' structured results from the batch autocomp-exec hands it (the
bag's declared metadata from structure-checker, the archive copy from archiver) and records
a catalogue entry that a later step, in any language, can read in turn.
"""

from pathlib import Path

from autocomp_step import Batch, PermanentFailure, run


def work(batch: Batch, settings: dict) -> dict:
    archived = batch.result("Data_Archived")
    checked = batch.result("Structure_Checked")
    if archived is None or checked is None:
        raise PermanentFailure("no Data_Archived or Structure_Checked result to catalogue")
    archive = Path(archived["archive_path"])
    if not archive.is_dir():
        raise PermanentFailure(f"the archive copy {archive} is gone")
    info = checked.get("bag_info", {})
    # A line of what it did: autocomp-exec keeps stdout as the run's output.
    print(f"catalogued {batch.id}: {archived['fixity']['files']} files archived at {archive}")
    return {
        "identifier": info.get("external_identifier") or batch.id,
        "source_organization": info.get("source_organization"),
        "bagging_date": info.get("bagging_date"),
        "archive_path": str(archive),
        "files": archived["fixity"]["files"],
        "manifest_digest": archived["fixity"]["manifest_digest"],
    }


if __name__ == "__main__":
    run(work)
