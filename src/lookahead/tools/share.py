"""Push a repository's outputs together with its whole run-cache, objects included (docs/sharing.md).

``dvc push --run-cache`` sends the run-cache records (which stage ran with which dependencies and
produced which output hashes) but, since DVC 3, not the objects of those outputs: only the
outputs of the revisions pushed travel. A teammate whose clone has the records but not the objects
reruns a stage instead of restoring it, e.g. after switching a param back to a value the pusher
ran and reverted. Here every run-cache record's outputs are pushed too, the ``cache: false``
metrics files included (DVC keeps their objects in the local cache when it records a run).

    python -m lookahead.tools.share [-r REMOTE] [-j JOBS]      # or: make push

On the other side nothing special is needed: ``dvc pull --run-cache`` then ``dvc repro --pull``
(or ``dvc exp run --pull``) restores any recorded run.
"""

from __future__ import annotations

import argparse
import sys


def push_everything(root: str = ".", remote: str | None = None, jobs: int | None = None) -> dict[str, int]:
    """``dvc push --run-cache`` plus the objects of every run-cache record; returns the counts."""
    from dvc.repo import Repo

    with Repo(root) as repo:
        pushed = repo.push(remote=remote, jobs=jobs, run_cache=True)
        records = [(key, value) for key, value in _records(repo)]
        used = repo.stage_cache.get_used_objs(records)
        objs = set().union(*used.values()) if used else set()
        result = repo.cloud.push(objs, jobs=jobs, remote=remote)
        if result.failed:
            raise RuntimeError(f"{len(result.failed)} run-cache objects failed to upload")
    return {"pushed": pushed, "run_records": len(records), "run_objects": len(objs),
            "run_objects_sent": len(result.transferred)}


def _records(repo):
    """(key, value) of every run-cache record in the local cache (``runs/<k[:2]>/<key>/<value>``)."""
    fs, runs = repo.cache.legacy.fs, repo.stage_cache.cache_dir
    if not fs.exists(runs):
        return
    for path in fs.find(runs):
        yield fs.name(fs.parent(path)), fs.name(path)


def main(argv: list[str] | None = None) -> None:
    from dvc.exceptions import DvcException

    parser = argparse.ArgumentParser(prog="python -m lookahead.tools.share", description=__doc__.split("\n\n")[0])
    parser.add_argument("-r", "--remote", default=None, help="DVC remote (default: the default remote)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel uploads")
    args = parser.parse_args(argv)
    try:
        counts = push_everything(remote=args.remote, jobs=args.jobs)
    except (DvcException, RuntimeError) as err:
        sys.exit(f"ERROR: {err}")
    print(f"{counts['pushed']} outputs pushed; {counts['run_records']} run records, whose "
          f"{counts['run_objects']} objects are on the remote ({counts['run_objects_sent']} sent now)")


if __name__ == "__main__":
    main()
