"""Remotes: an SSH remote that goes down in the middle of `dvc push`, and a `dvc pull` cut off the
same way, each then retried. Both end consistent: nothing lost locally, every object on the remote
and in the clone's cache whole (its md5 is its name), the clone's workspace equal to the original's.

The server is the sharing tests' real sshd; the failure is a TCP relay in front of it that dies
after a byte budget (lookahead.tools.faults.CuttingProxy). The remote is set up as docs/sharing.md says, with
``verify = true``: without it DVC (dvc-objects 5.2) can keep the half-downloaded object of a cut
pull in its cache under the object's name, and the retried pull checks that truncated file out while
`dvc status` says all is up to date (it happened here when the cut landed on a lone download)."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest

from lookahead.tools.faults import CuttingProxy, dvc_objects, file_digests, objects_whole
from tests.conftest import sh
from tests.reliability.conftest import assert_up_to_date

pytestmark = pytest.mark.slow


def outputs(repo: Path) -> dict[str, str]:
    """{path: md5} of every file of the pipeline's outputs in ``repo`` (data/ and models/)."""
    return {f"{top}/{name}": md5 for top in ("data", "models") for name, md5 in file_digests(repo / top).items()}


def test_ssh_remote_dying_mid_push_and_pull_then_retried(reproduced, sshd, tmp_path):
    port, key, _, home = sshd
    repo, env = reproduced
    env = {**env, "HOME": str(home)}
    proxy = CuttingProxy(("127.0.0.1", port))
    known = home / ".ssh" / "known_hosts"
    host_key = known.read_text().splitlines()[0].split(" ", 1)[1]
    known.write_text(known.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")  # the same server behind the relay
    store = tmp_path / "store"
    for args in (["add", "-f", "-d", "flaky", f"ssh://127.0.0.1:{proxy.port}{store}"],
                 ["modify", "--local", "flaky", "user", getpass.getuser()],
                 ["modify", "--local", "flaky", "keyfile", str(key)],
                 ["modify", "--local", "flaky", "timeout", "10"],
                 ["modify", "flaky", "verify", "true"]):  # in .dvc/config: the clone has it too
        sh(["dvc", "remote", *args], repo, env)
    sh(["git", "commit", "-qam", "flaky remote"], repo, env)
    local = dvc_objects(repo / ".dvc" / "cache")
    lock = (repo / "dvc.lock").read_bytes()
    total = sum(p.stat().st_size for p in local.values())
    assert total > 1_000_000  # enough bytes that a third of them is mid-transfer

    proxy.revive(budget=total // 3)
    out = sh(["dvc", "push"], repo, env, check=False)
    assert proxy.dead and "ERROR" in out and "Traceback" not in out, out[-2000:]
    assert dvc_objects(repo / ".dvc" / "cache") == local and objects_whole(local)
    assert (repo / "dvc.lock").read_bytes() == lock
    partial = dvc_objects(store)
    assert objects_whole(partial)  # what arrived is whole; the rest did not arrive

    proxy.revive()
    sh(["dvc", "push"], repo, env)
    assert "Cache and remote 'flaky' are in sync" in sh(["dvc", "status", "--cloud"], repo, env)
    remote = dvc_objects(store)
    assert set(partial) < set(remote) <= set(local) and objects_whole(remote)

    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    for args in (["user", getpass.getuser()], ["keyfile", str(key)], ["timeout", "10"]):
        sh(["dvc", "remote", "modify", "--local", "flaky", *args], clone, env)
    proxy.revive(budget=total // 3)
    out = sh(["dvc", "pull"], clone, env, check=False)
    assert proxy.dead and "ERROR" in out and "Traceback" not in out, out[-2000:]
    assert dvc_objects(store) == remote and objects_whole(remote)  # the remote lost nothing
    # what the cut pull left in the clone's cache and workspace is whole, or absent
    assert objects_whole(dvc_objects(clone / ".dvc" / "cache"))
    assert all(digest == outputs(repo)[name] for name, digest in outputs(clone).items())

    proxy.revive()
    sh(["dvc", "pull"], clone, env)
    assert_up_to_date(clone, env)
    assert outputs(clone) == outputs(repo)
    proxy.close()
