"""Fault injection (issue 17): the pieces the reliability tests and ``benchmarks/faults.py`` share.

- bad params: every key of a params tree given values of the wrong type, empty, out of range, huge,
  NaN and inf; unknown keys and sections; incompatible pairs (:func:`param_faults`), each checked the
  way ``python -m lookahead.core.config`` checks a file (:func:`refused_cleanly`);
- damaged files: :func:`truncate`, :func:`flip_bit`;
- interrupted commands: :func:`interrupt` runs a command in its own process group and sends it a
  signal once a training checkpoint has been written a given number of times (a real kill at a
  point of the run, not a simulated one);
- a flaky network: :class:`CuttingProxy` relays TCP to a server and dies after a byte budget (an
  SSH remote that goes down mid-transfer);
- set-up: :func:`scratch_repo` (a tiny pipeline repository), :func:`start_sshd` (a real SSH server);
- what survived: :func:`file_digests` (md5 of every file of an output), :func:`dvc_objects` and
  :func:`objects_whole` (the content-addressed objects of a DVC cache or remote, and whether each
  one's bytes still hash to its name).

Nothing here is imported by a stage.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from lookahead.core.atomic import temporaries
from lookahead.core.config import from_dict
from lookahead.core.errors import ConfigError
from lookahead.core.inputs import visible_files

HUGE_INT, HUGE_FLOAT = 10**12, 1e30
# keys whose negative values are legitimate (the fuzz's out-of-range value is -10**6)
SIGNED_KEYS = {"predictor.init_bias"}
# keys whose null is legitimate (the oracle stage's setting) where a profile sets a number
NULLABLE_KEYS = {"phase1.score_per_round", "phase1.score_candidates"}


# --- bad params -----------------------------------------------------------------------------------

def leaves(tree: dict, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, value) of every non-mapping value of a params tree."""
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += leaves(value, prefix + (key,))
        else:
            out.append((prefix + (key,), value))
    return out


def bad_values(key: str, value: Any) -> dict[str, Any]:
    """The bad values tried for ``key`` whose valid value is ``value``, by kind."""
    if isinstance(value, bool):
        return {"wrong_type": "yes", "empty": None}
    if isinstance(value, (int, float)):
        bad = {"wrong_type": "abc", "empty": None, "out_of_range": -10**6,
               "huge": HUGE_INT if isinstance(value, int) else HUGE_FLOAT, "nan": math.nan, "inf": math.inf}
        if key in SIGNED_KEYS:
            del bad["out_of_range"]
        if key in NULLABLE_KEYS:
            del bad["empty"]
        return bad
    if isinstance(value, str):
        return {"wrong_type": 12345, "empty": ""}
    if isinstance(value, list):
        return {"wrong_type": "not a list", "empty": [], "item_wrong_type": [{"x": 1}]}
    return {"wrong_type": {"unexpected": "mapping"}}  # null-able keys (null in the profile)


def edited(params: dict, path: tuple[str, ...], value: Any) -> dict:
    out = copy.deepcopy(params)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def param_faults(params: dict) -> list[tuple[str, str, dict]]:
    """(kind, key, edited params) for every fault tried on a valid params tree."""
    cases = []
    for path, value in leaves(params):
        key = ".".join(path)
        for kind, bad in bad_values(key, value).items():
            if bad != value:
                cases.append((kind, key, edited(params, path, bad)))
    for section in params:
        cases.append(("unknown_key", f"{section}.no_such_key", edited(params, (section, "no_such_key"), 1)))
    cases.append(("unknown_section", "no_such_section", {**params, "no_such_section": {}}))
    phase1, phase2 = params.get("phase1"), params.get("phase2")
    if phase1:
        cases.append(("incompatible", "phase1.tau_end", {**params, "phase1": {**phase1, "tau_start": 0.5, "tau_end": 1.0}}))
        cases.append(("incompatible", "phase1.hard_from_step",
                      {**params, "phase1": {**phase1, "hard_from_step": phase1["train"]["steps"]}}))
    if phase2:
        cases.append(("incompatible", "phase2.tau_end", {**params, "phase2": {**phase2, "tau_start": 0.5, "tau_end": 1.0}}))
    return cases


def refused_cleanly(params: dict, key: str) -> tuple[bool, str]:
    """(refused with ``key`` named, what happened): the edited section loads into its dataclass as
    ``python -m lookahead.core.config`` loads it (the whole file for an unknown section)."""
    from lookahead.tools.params import SECTIONS, section_class, validate_all

    section = key.split(".")[0]
    try:
        if section in SECTIONS:
            try:
                from_dict(section_class(section), params[section])
            except ConfigError as err:
                raise err.under(section) from None
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "params.yaml"
                path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
                validate_all(path)
    except ConfigError as err:
        named = err.key == key or err.key.startswith((key + ".", key + "["))
        return named, f"ConfigError({err.key}): {err.message[:100]}"
    except Exception as err:  # noqa: BLE001 - any other exception is an unclear error
        return False, f"{type(err).__name__}: {str(err)[:120]}"
    return False, "accepted"


# --- damaged files --------------------------------------------------------------------------------

def truncate(path: str | Path, keep: float = 0.5) -> None:
    """Cut ``path`` to ``keep`` of its size (a copy interrupted mid-way)."""
    path = Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip_bit(path: str | Path, offset: int, bit: int = 0) -> None:
    """Flip one bit of byte ``offset`` (negative: from the end) of ``path``."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


# --- what survived -------------------------------------------------------------------------------

def file_digests(path: str | Path) -> dict[str, str]:
    """{name: md5} of a file, or {path relative to it: md5} of every visible file under a directory
    (:func:`lookahead.core.inputs.visible_files`: an interrupted writer's temporaries are left out)."""
    path = Path(path)
    if not path.is_dir():
        return {path.name: hashlib.md5(path.read_bytes()).hexdigest()}
    return {str(p.relative_to(path)): hashlib.md5(p.read_bytes()).hexdigest() for p in visible_files(path)}


def dvc_objects(root: str | Path) -> dict[str, Path]:
    """{md5: file} of the content-addressed objects under a DVC cache or remote (``files/md5/ab/cdef…``,
    a directory listing's name ending in ``.dir``). An upload cut short leaves ``<md5>.<random>.tmp``
    there, which DVC never reads as an object: left out."""
    found = {p.parent.name + p.name: p for p in (Path(root) / "files" / "md5").rglob("*") if p.is_file()}
    return {name: p for name, p in found.items() if re.fullmatch(r"[0-9a-f]{32}(\.dir)?", name)}


def objects_whole(objs: dict[str, Path]) -> bool:
    """Every object's bytes hash to its name: none is truncated or damaged."""
    return all(hashlib.md5(p.read_bytes()).hexdigest() == name.removesuffix(".dir") for name, p in objs.items())


# --- interrupted commands -------------------------------------------------------------------------

def _saves(root: Path, seen: set) -> int:
    for path in root.rglob("checkpoint.pt"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        seen.add((st.st_ino, st.st_mtime_ns))  # each save renames a new file into place
    return len(seen)


def lock_outs(repo: Path, lock: bytes | str | None = None) -> dict[str, str]:
    """{output path: md5} of every stage in ``repo``'s dvc.lock (or in ``lock``, its text), metrics
    and plots included."""
    data = yaml.safe_load(lock if lock is not None else (Path(repo) / "dvc.lock").read_bytes())
    return {out["path"]: out["md5"] for entry in data["stages"].values() for out in entry.get("outs", [])}


def after_checkpoints(root: str | Path, n: int = 1) -> Callable[[], bool]:
    """True once ``n`` checkpoints have been written under ``root`` (a stage's checkpoints
    directory) since this call: earlier runs' checkpoints do not count."""
    root, before = Path(root), set()
    _saves(root, before)
    seen = set(before)
    return lambda: _saves(root, seen) - len(before) >= n


def while_writing(path: str | Path) -> Callable[[], bool]:
    """True while a temporary sibling of ``path`` exists (lookahead.core.atomic writes it, then renames)."""
    return lambda: bool(temporaries(path))


def interrupt(cmd: list[str], cwd: Path, env: dict, sig: int, *, when: Callable[[], bool] | None = None,
              delay: float = 0.0, timeout: float = 300.0) -> dict[str, Any]:
    """Run ``cmd`` in its own process group and, ``delay`` s after ``when()`` first holds (polled
    every 2 ms; None: at once), send ``sig`` to the whole group, as Ctrl-C in a terminal (SIGINT)
    or ``kill -9`` of the group does.

    Returns {"returncode", "output", "signalled": whether the signal went out before the command
    ended by itself}."""
    with tempfile.TemporaryFile("w+") as log:
        # SIGINT as a terminal delivers it: a shell starts background jobs with SIGINT ignored, and an
        # ignored signal stays ignored across exec, so reset it for the command
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        start, signalled = time.monotonic(), False
        while proc.poll() is None and time.monotonic() - start < timeout:
            if when is None or when():
                time.sleep(delay)
                if proc.poll() is None:
                    os.killpg(proc.pid, sig)
                    signalled = True
                break
            time.sleep(0.002)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if signalled and sig != signal.SIGKILL:
            try:  # whatever the signal left running goes too, as with a closed terminal
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.seek(0)
        return {"returncode": proc.returncode, "output": log.read(), "signalled": signalled}


# --- a flaky network ------------------------------------------------------------------------------

class CuttingProxy:
    """A TCP relay on 127.0.0.1:<port> to ``target`` that dies once more than ``budget`` bytes have
    crossed it (either way, all connections together): every open connection is cut and new ones
    are refused, as by a server that went down in the middle of a transfer, until :meth:`revive`
    (``budget`` None: it never dies)."""

    def __init__(self, target: tuple[str, int], budget: int | None = None):
        self.target, self.budget = target, budget
        self.crossed, self.dead, self.cuts = 0, False, 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def revive(self, budget: int | None = None) -> None:
        with self._lock:
            self.budget, self.crossed, self.dead = budget, 0, False

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            if self.dead:
                client.close()
                continue
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _count(self, n: int) -> bool:
        """Add ``n`` crossed bytes; False once the relay is dead."""
        with self._lock:
            self.crossed += n
            if not self.dead and self.budget is not None and self.crossed > self.budget:
                self.dead = True
            return not self.dead

    def _relay(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        for sock in (client, server):  # relay each packet at once (Nagle + delayed ACKs: 40 ms a round trip)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while not self._stop.is_set() and not self.dead:
                ready, _, _ = select.select([client, server], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if not self._count(len(data)):
                        return
                    (server if sock is client else client).sendall(data)
        except OSError:
            return
        finally:
            if self.dead:
                self.cuts += 1
            client.close()
            server.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


# --- a scratch pipeline and an SSH server (the benchmark's and the tests' set-up) ------------------

def run(cmd: list[str], cwd: Path, env: dict, check: bool = True) -> str:
    """Run a command; its stdout + stderr (a RuntimeError showing them when ``check`` and it fails)."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-4000:]}")
    return out


def scratch_repo(project: Path, dest: Path, profile: str = "profiles/tiny.yaml") -> tuple[Path, dict]:
    """A fresh git + DVC repository at ``dest`` holding ``project``'s tracked and unignored files
    (no outputs, no lock file), with ``profile`` as its params.yaml, committed: (path, env), where
    env runs this interpreter's ``python`` and ``dvc`` with nothing of the caller's MLflow/DVC settings."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=project,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        src = project / name
        if src.is_file() and not name.startswith(("metrics/", "data/", "models/")) and name != "dvc.lock":
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    shutil.copy(dest / profile, dest / "params.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["DVC_NO_ANALYTICS"] = "true"
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@example.com"],
                ["git", "config", "user.name", "test"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        run(cmd, dest, env)
    return dest, env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sshd(d: Path) -> tuple[subprocess.Popen, int, Path, Path, Path]:
    """OpenSSH's sshd on 127.0.0.1:<free port> accepting one generated key, its files in ``d``:
    (process, port, client key, a key it refuses, a HOME whose known_hosts has the server's key)."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).is_file():
        raise RuntimeError("no sshd: run `make setup` (scripts/setup_sshd.sh installs Debian's openssh-server)")
    d.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "client_key", "stranger_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        "Subsystem sftp internal-sftp\n"
    )
    try:
        Path("/run/sshd").mkdir(exist_ok=True)  # the privilege-separation directory sshd wants as root
    except PermissionError:
        pass  # not root: sshd runs unprivileged and does not need it
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {proc.stderr.read()}")
        time.sleep(0.2)
    home = d / "home"
    (home / ".ssh").mkdir(parents=True)
    host_pub = (d / "host_key.pub").read_text().split()
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    return proc, port, d / "client_key", d / "stranger_key", home
