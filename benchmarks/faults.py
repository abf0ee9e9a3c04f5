"""Fault injection across the whole pipeline (issue 17): the reliability suite's wider sweep.

In a scratch copy of the project running the tiny profile (`dvc repro` once: the reference, runs
never interrupted), it injects, one at a time, and checks that each is *survived* (nothing lost, the
pipeline back to the reference) and, where it stops a command, that the error is *clear* (one line
naming the file or key and the fix, no traceback, dvc.lock unchanged):

- bad_params: every key of every section of profiles/tiny.yaml and params.yaml given values of the
  wrong type, empty, out of range, huge, NaN, inf; unknown keys and sections; incompatible pairs;
- kill_training: SIGKILL and SIGINT of `dvc repro -f -s <stage>` for every training stage at
  ``--points`` random points after a checkpoint, then the same command again: it must resume and end
  with the bytes of the reference (model and data outputs; metrics hold timings);
- kill_writing: every other stage SIGKILLed while it writes its first output: no half output, `dvc
  status` says the stage must run, and running it gives the reference's bytes;
- corrupt_file: every safetensors / .npy / JSON file of the stage outputs truncated and with a bit
  of its header flipped, checked as a stage checks its inputs; a bit flipped in the data of some
  (DVC's `dvc status` must list them, `dvc repro` restore them); a training checkpoint truncated;
  a WordNet directory missing each of its files in turn;
- resources: the disk full under two stages' outputs (a small tmpfs; needs root), two `dvc repro`
  at once, a NaN reaching a training loss;
- remote: an SSH remote dying mid-push and mid-pull at several points, then retried.

    python benchmarks/faults.py [--points 2] [--seed 0] [--only kind,...]

Prints one JSON line: faults_injected, faults_survived, bad_inputs_tried, clear_errors, by_kind
({kind: {injected, survived}}), seconds, and failures (each fault that was not survived or whose
error was not clear, named); a fault whose signal arrived after its command had already finished is
counted under missed, not injected.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lookahead.core.atomic import temporaries
from lookahead.core.inputs import CorruptInput, check_input
from lookahead.semantics import wordnet_source as wordnet_data
from lookahead.tools import faults

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ("base", "modulator", "phase1", "diffusion", "phase2", "control")
WRITING = ("corpus", "tokenizer", "wordnet", "probe", "init", "contexts", "pairs", "evaluate")
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGINT": signal.SIGINT}


class Tally:
    def __init__(self) -> None:
        self.by_kind: dict[str, dict[str, int]] = {}
        self.failures: list[str] = []
        self.bad_inputs = self.clear = 0

    def add(self, kind: str, name: str, survived: bool, why: str = "", bad_input: bool = False,
            clear: bool | None = None) -> None:
        counts = self.by_kind.setdefault(kind, {"injected": 0, "survived": 0})
        counts["injected"] += 1
        counts["survived"] += survived
        if bad_input:
            self.bad_inputs += 1
            self.clear += bool(clear)
        if not survived or (bad_input and not clear):
            self.failures.append(f"{kind}: {name}: {why[:300]}")
        if kind != "bad_params":  # progress, one line a fault (stderr; the JSON line goes to stdout)
            print(f"{kind}: {name}: {'survived' if survived else 'NOT SURVIVED'}"
                  f"{'' if clear is None else ', clear error' if clear else ', UNCLEAR ERROR'}", file=sys.stderr, flush=True)

    def crashed(self, kind: str, err: BaseException) -> None:
        """A kind whose own set-up failed: one failure, the sweep goes on."""
        self.by_kind.setdefault(kind, {"injected": 0, "survived": 0})
        self.failures.append(f"{kind}: the sweep itself failed: {type(err).__name__}: {str(err)[:300]}")

    def missed(self, kind: str) -> None:
        counts = self.by_kind.setdefault(kind, {"injected": 0, "survived": 0})
        counts["missed"] = counts.get("missed", 0) + 1


def lock_outs(repo: Path) -> dict[str, dict[str, str]]:
    """{stage: {output path: md5}} of the lock file."""
    data = yaml.safe_load((repo / "dvc.lock").read_text())
    return {stage: {o["path"]: o["md5"] for o in entry.get("outs", [])} for stage, entry in data["stages"].items()}


def data_outs(outs: dict[str, str]) -> dict[str, str]:
    return {p: m for p, m in outs.items() if not p.startswith("metrics/")}


def up_to_date(repo: Path, env: dict) -> bool:
    return "Data and pipelines are up to date" in faults.run(["dvc", "status"], repo, env, check=False)


def error_line(out: str) -> str | None:
    return next((line for line in out.splitlines() if line.startswith("error (")), None)


def restore(repo: Path, env: dict) -> None:
    """Back to the reference after a fault: checkout from the cache (nothing recomputed)."""
    faults.run(["dvc", "checkout", "-f"], repo, env, check=False)


# --- kinds ----------------------------------------------------------------------------------------

def bad_params(tally: Tally) -> None:
    for profile in ("profiles/tiny.yaml", "params.yaml"):
        params = yaml.safe_load((ROOT / profile).read_text(encoding="utf-8"))
        for kind, key, case in faults.param_faults(params):
            ok, what = faults.refused_cleanly(case, key)
            tally.add("bad_params", f"{profile}: {key} ({kind})", ok, what, bad_input=True, clear=ok)


def kill_training(tally: Tally, repo: Path, env: dict, reference: dict, points: int, rng: random.Random) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for stage in TRAINING:
        train = (params["phase2"] if stage == "control" else params[stage])["train"]
        saves = max(1, (train["steps"] - 1) // train["checkpoint_every"])
        for sig_name, sig in SIGNALS.items():
            for point in range(points):
                n, delay = rng.randint(1, saves), rng.uniform(0.0, 0.05)
                name = f"{stage} {sig_name} after checkpoint {n} + {delay * 1000:.0f} ms"
                killed = faults.interrupt(["dvc", "repro", "-f", "-s", stage], repo, env, sig,
                                          when=faults.after_checkpoints(repo / "checkpoints" / stage, n), delay=delay)
                if not killed["signalled"]:
                    tally.missed("kill_training")
                    continue
                out = faults.run(["dvc", "repro", "-f", "-s", stage], repo, env, check=False)
                resumed = re.search(rf"{stage}: resuming from step (\d+)", out)
                same = data_outs(lock_outs(repo)[stage]) == data_outs(reference[stage])
                ok = bool(resumed) and same and up_to_date(repo, env)
                why = f"resumed {resumed.group(1) if resumed else 'no'}, same bytes {same}, " + (error_line(out) or "")
                tally.add("kill_training", name, ok, why)
                if not ok:
                    restore(repo, env)


def kill_writing(tally: Tally, repo: Path, env: dict, reference: dict) -> None:
    for stage in WRITING:
        outs = list(reference[stage])
        first = next((p for p in outs if not p.startswith("metrics/")), outs[0])
        whole = faults.file_digests(repo / first)
        killed = faults.interrupt(["dvc", "repro", "-f", "-s", stage], repo, env, signal.SIGKILL,
                                  when=faults.while_writing(repo / first))
        if not killed["signalled"]:
            tally.missed("kill_writing")
            continue
        # none (DVC removed it before the run), or whole: the signal came just after the rename
        gone = not (repo / first).exists() or faults.file_digests(repo / first) == whole
        status = faults.run(["dvc", "status", stage], repo, env, check=False)
        told = f"{stage}:" in status and "deleted:" in status
        faults.run(["dvc", "repro", "-f", "-s", stage], repo, env, check=False)
        same = data_outs(lock_outs(repo)[stage]) == data_outs(reference[stage])
        swept = not temporaries(repo / first)
        ok = gone and told and same and swept and up_to_date(repo, env)
        tally.add("kill_writing", f"{stage} while writing {first}", ok,
                  f"no half output {gone}, status says rerun {told}, same bytes {same}, leftovers swept {swept}")
        if not ok:
            restore(repo, env)


def corrupt_files(tally: Tally, repo: Path, env: dict, rng: random.Random) -> None:
    files = sorted(p for top in ("models", "data") for p in (repo / top).rglob("*")
                   if p.is_file() and p.suffix in (".safetensors", ".npy", ".json"))
    damages = {
        "truncated": lambda p: faults.truncate(p, 0.5),
        "header bit": lambda p: faults.flip_bit(p, {".safetensors": 8, ".npy": 1, ".json": 0}[p.suffix], 1),
    }
    cwd = Path.cwd()
    os.chdir(repo)  # the fix names DVC paths relative to the repository
    try:
        for path in files:
            rel = path.relative_to(repo)
            good = path.read_bytes()
            for damage_name, damage in damages.items():
                path.unlink()  # DVC may link outputs to its cache: never write through
                path.write_bytes(good)
                damage(path)
                try:
                    check_input(rel.parts[0] + "/" + rel.parts[1], "--input")
                    ok, why = False, "accepted"
                except CorruptInput as err:
                    text = str(err)
                    ok = str(rel) in text and "dvc checkout" in text and "dvc repro -f" in text
                    why = text
                tally.add("corrupt_file", f"{rel} {damage_name}", ok, why, bad_input=True, clear=ok)
                path.unlink()
                path.write_bytes(good)
    finally:
        os.chdir(cwd)
    # bits flipped in the data, past every header: DVC must notice and restore them
    for path in rng.sample([p for p in files if p.suffix != ".json"], k=min(6, len(files))):
        rel = path.relative_to(repo)
        good = path.read_bytes()
        path.unlink()
        path.write_bytes(good)
        faults.flip_bit(path, -1 - rng.randrange(min(len(good) // 4, 4096)), rng.randrange(8))
        status = faults.run(["dvc", "status"], repo, env, check=False)
        listed = "modified:" in status and str(rel.parts[0] + "/" + rel.parts[1]) in status
        out = faults.run(["dvc", "repro"], repo, env, check=False)
        ok = listed and path.read_bytes() == good and "Running stage" not in out and up_to_date(repo, env)
        tally.add("corrupt_file", f"{rel} data bit", ok, f"dvc status listed it {listed}")
        if not ok:
            restore(repo, env)


def corrupt_checkpoint(tally: Tally, repo: Path, env: dict, reference: dict) -> None:
    killed = faults.interrupt(["dvc", "repro", "-f", "-s", "phase1"], repo, env, signal.SIGKILL,
                              when=faults.after_checkpoints(repo / "checkpoints" / "phase1", 1))
    checkpoint = next((repo / "checkpoints" / "phase1").rglob("checkpoint.pt"), None)
    if not killed["signalled"] or checkpoint is None:
        tally.missed("corrupt_file")
        return
    lock = (repo / "dvc.lock").read_bytes()
    faults.truncate(checkpoint, 0.5)
    out = faults.run(["dvc", "repro", "-f", "-s", "phase1"], repo, env, check=False)
    line = error_line(out) or ""
    clear = (str(checkpoint.relative_to(repo)) in line and f"rm -r {checkpoint.parent.relative_to(repo)}" in line
             and "Traceback" not in out and (repo / "dvc.lock").read_bytes() == lock)
    shutil.rmtree(checkpoint.parent)  # the fix the message names
    faults.run(["dvc", "repro", "-f", "-s", "phase1"], repo, env, check=False)
    ok = clear and data_outs(lock_outs(repo)["phase1"]) == data_outs(reference["phase1"]) and up_to_date(repo, env)
    tally.add("corrupt_file", "phase1 checkpoint truncated", ok, line or out[-300:], bad_input=True, clear=clear)


def corrupt_wordnet(tally: Tally, tmp: Path) -> None:
    debian = wordnet_data.debian_wordnet_dir()
    if debian is None:
        tally.add("corrupt_file", "wordnet", False, "no Debian WordNet to damage: make setup")
        return
    for missing in wordnet_data.REQUIRED_FILES:
        partial = tmp / f"wn-{missing}"
        partial.mkdir()
        for name in wordnet_data.REQUIRED_FILES:
            if name != missing:
                (partial / name).symlink_to(debian / name)
        try:
            wordnet_data.open_wordnet(partial, root=tmp / "root")
            ok, why = False, "opened"
        except wordnet_data.WordNetMissing as err:
            ok, why = missing in str(err) and "apt-get install" in str(err), str(err)
        tally.add("corrupt_file", f"wordnet.path without {missing}", ok, why, bad_input=True, clear=ok)


def full_disk(tally: Tally, repo: Path, env: dict, tmp: Path) -> None:
    """Stage outputs on a tmpfs filled to 8 KiB short: the stage stops with DiskFull, the previous
    outputs (copied there first) are byte for byte as they were, no temporary is left."""
    commands = {
        "init": ["stages/init.py", "--base", "models/base", "--wordnet", "data/wordnet", "--heads",
                 "data/probe/heads.safetensors"],
        "wordnet": ["stages/wordnet.py", "--tokenizer", "models/tokenizer"],
    }
    outputs = {"init": {"out": "models/init/init.safetensors", "metrics": "metrics/init.json",
                        "report": "metrics/init_report.json"},
               "wordnet": {"out": "data/wordnet", "metrics": "metrics/wordnet.json",
                           "report": "metrics/wordnet_report.json"}}
    for stage, cmd in commands.items():
        disk = tmp / f"disk-{stage}"
        disk.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
            tally.missed("resources")
            continue
        try:
            for rel in outputs[stage].values():
                (disk / rel).parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if (repo / rel).is_dir() else shutil.copy)(repo / rel, disk / rel)
            before = {rel: faults.file_digests(disk / rel) for rel in outputs[stage].values()}
            with open(disk / "filler", "wb") as f:
                f.write(b"\0" * (shutil.disk_usage(disk).free - 8192))
            proc = subprocess.run([sys.executable, *cmd, *[f"--{n}={disk / rel}" for n, rel in outputs[stage].items()]],
                                  cwd=repo, env=env, capture_output=True, text=True)
            line = error_line(proc.stderr) or proc.stderr[-300:]
            clear = proc.returncode == 2 and line.startswith("error (DiskFull)") and "Traceback" not in proc.stderr
            after = {rel: faults.file_digests(disk / rel) for rel in outputs[stage].values()}
            intact = after == before and not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]
            tally.add("resources", f"disk full under {stage}'s outputs", intact, line, bad_input=True, clear=clear)
        finally:
            subprocess.run(["umount", str(disk)], check=False)


def concurrent_repro(tally: Tally, repo: Path, env: dict, reference: dict) -> None:
    first = subprocess.Popen(["dvc", "repro", "-f", "-s", "contexts"], cwd=repo, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while (repo / "data" / "contexts").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(["dvc", "repro"], cwd=repo, env=env, capture_output=True, text=True)
    first.communicate(timeout=600)
    clear = second.returncode != 0 and "Traceback" not in second.stderr and \
        re.search(r"Unable to acquire lock|is busy, it is being blocked by", second.stderr) is not None
    ok = first.returncode == 0 and data_outs(lock_outs(repo)["contexts"]) == data_outs(reference["contexts"]) \
        and up_to_date(repo, env)
    tally.add("resources", "two dvc repro at once", ok and clear, second.stderr[-300:], bad_input=True, clear=clear)


def nan_loss(tally: Tally, repo: Path, env: dict) -> None:
    from safetensors.torch import load_file, save_file

    weights = repo / "models" / "base" / "model.safetensors"
    lock = (repo / "dvc.lock").read_bytes()
    tensors = load_file(str(weights))
    tensors["model.norm.weight"][0] = float("nan")
    weights.unlink()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    out = faults.run(["dvc", "repro", "-s", "modulator"], repo, env, check=False)
    line = error_line(out) or out[-300:]
    clear = line.startswith("error (NonFiniteLoss): modulator: training loss is nan at step") and "Traceback" not in out \
        and (repo / "dvc.lock").read_bytes() == lock
    faults.run(["dvc", "checkout", "--force", "models/base"], repo, env, check=False)
    faults.run(["dvc", "repro"], repo, env, check=False)
    tally.add("resources", "NaN reaching the modulator's loss", up_to_date(repo, env), line, bad_input=True, clear=clear)


def remotes(tally: Tally, repo: Path, env: dict, tmp: Path) -> None:
    """Push and pull cut at several points, each retried, through a remote set up as the README says
    (``verify = true``). The same cut pulls through a remote left at DVC's default (no verify) are
    counted apart, as ``unverified_pull_poisoned``: a retried pull that ends with a file unlike the
    original's while `dvc status` says up to date (dvc-objects 5.2 keeps a cut lone download)."""
    proc, port, key, _, home = faults.start_sshd(tmp / "sshd")
    env = {**env, "HOME": str(home)}
    proxy = faults.CuttingProxy(("127.0.0.1", port))

    def outputs(root: Path) -> dict[str, str]:
        return {f"{top}/{n}": md5 for top in ("data", "models") for n, md5 in faults.file_digests(root / top).items()}

    def cut_pull(clone: Path, budget: int, verify: bool) -> tuple[bool, bool, str]:
        """(equal to the original and up to date after the retry, the cut's error clear, its output)."""
        faults.run(["git", "clone", "-q", str(repo), str(clone)], tmp, env)
        faults.run(["dvc", "remote", "modify", "flaky", "verify", str(verify).lower()], clone, env)
        for args in (["user", getpass.getuser()], ["keyfile", str(key)], ["timeout", "10"]):
            faults.run(["dvc", "remote", "modify", "--local", "flaky", *args], clone, env)
        proxy.revive(budget)
        out = faults.run(["dvc", "pull"], clone, env, check=False)
        clear = proxy.dead and "ERROR" in out and "Traceback" not in out
        cache_whole = faults.objects_whole(faults.dvc_objects(clone / ".dvc" / "cache"))
        proxy.revive()
        faults.run(["dvc", "pull"], clone, env, check=False)
        return cache_whole and up_to_date(clone, env) and outputs(clone) == reference, clear, out

    try:
        known = home / ".ssh" / "known_hosts"
        known.write_text(known.read_text() + f"[127.0.0.1]:{proxy.port} {known.read_text().split(' ', 1)[1]}")
        local = faults.dvc_objects(repo / ".dvc" / "cache")
        total = sum(p.stat().st_size for p in local.values())
        reference = outputs(repo)
        poisoned = 0
        for i, share in enumerate((0.1, 0.4, 0.8)):
            store = tmp / f"store{i}"
            faults.run(["dvc", "remote", "add", "-f", "-d", "flaky", f"ssh://127.0.0.1:{proxy.port}{store}"], repo, env)
            faults.run(["dvc", "remote", "modify", "flaky", "verify", "true"], repo, env)
            for args in (["user", getpass.getuser()], ["keyfile", str(key)], ["timeout", "10"]):
                faults.run(["dvc", "remote", "modify", "--local", "flaky", *args], repo, env)
            faults.run(["git", "commit", "-qam", f"remote {i}"], repo, env)
            proxy.revive(int(total * share))
            out = faults.run(["dvc", "push"], repo, env, check=False)
            clear = proxy.dead and "ERROR" in out and "Traceback" not in out
            proxy.revive()
            faults.run(["dvc", "push"], repo, env, check=False)
            pushed = faults.dvc_objects(store)
            in_sync = "are in sync" in faults.run(["dvc", "status", "--cloud"], repo, env, check=False)
            ok = (in_sync and set(pushed) <= set(local) and faults.objects_whole(pushed)
                  and faults.dvc_objects(repo / ".dvc" / "cache") == local)
            tally.add("remote", f"ssh remote dies after {share:.0%} of a push, push retried", ok,
                      out[-300:], bad_input=True, clear=clear)

            ok, clear, out = cut_pull(tmp / f"clone{i}", int(total * share), verify=True)
            ok = ok and faults.dvc_objects(store) == pushed and faults.objects_whole(pushed)
            tally.add("remote", f"ssh remote dies after {share:.0%} of a pull, pull retried", ok,
                      out[-300:], bad_input=True, clear=clear)
            poisoned += not cut_pull(tmp / f"unverified{i}", int(total * share), verify=False)[0]
        tally.by_kind["remote"]["unverified_pull_poisoned"] = poisoned
        print(f"remote: the same cut pulls without verify: {poisoned} of 3 did not end equal to the original",
              file=sys.stderr, flush=True)
    finally:
        proxy.close()
        proc.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=2, help="random kill points per training stage and signal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated kinds (default: all)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    want = lambda kind: not only or kind in only  # noqa: E731
    rng, tally, start = random.Random(args.seed), Tally(), time.perf_counter()
    if want("bad_params"):
        bad_params(tally)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if only - {"bad_params"} or not only:
            repo, env = faults.scratch_repo(ROOT, tmp / "repo")
            faults.run(["dvc", "repro"], repo, env)
            faults.run(["git", "add", "-A"], repo, env)
            faults.run(["git", "commit", "-qm", "reference"], repo, env)
            reference = lock_outs(repo)
            sweeps = {
                "kill_training": [lambda: kill_training(tally, repo, env, reference, args.points, rng)],
                "kill_writing": [lambda: kill_writing(tally, repo, env, reference)],
                "corrupt_file": [lambda: corrupt_files(tally, repo, env, rng),
                                 lambda: corrupt_checkpoint(tally, repo, env, reference),
                                 lambda: corrupt_wordnet(tally, tmp)],
                "resources": [lambda: full_disk(tally, repo, env, tmp),
                              lambda: concurrent_repro(tally, repo, env, reference),
                              lambda: nan_loss(tally, repo, env)],
                "remote": [lambda: remotes(tally, repo, env, tmp)],
            }
            for kind, parts in sweeps.items():
                for part in parts if want(kind) else []:
                    try:
                        part()
                    except Exception as err:  # noqa: BLE001 - recorded as a failure; the other kinds still run
                        tally.crashed(kind, err)
                        restore(repo, env)
    injected = sum(c["injected"] for c in tally.by_kind.values())
    survived = sum(c["survived"] for c in tally.by_kind.values())
    print(json.dumps({"faults_injected": injected, "faults_survived": survived, "bad_inputs_tried": tally.bad_inputs,
                      "clear_errors": tally.clear, "by_kind": tally.by_kind,
                      "seconds": round(time.perf_counter() - start, 1), "failures": tally.failures}))


if __name__ == "__main__":
    main()
