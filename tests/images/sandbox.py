"""Run a command in an unpacked image the way a container runtime would, without one.

A private mount namespace (``unshare --mount``) holds every mount, so nothing outlives the call
and the host's mounts are untouched: the image's root filesystem is mounted either read-only
(``readOnlyRootFilesystem: true``, as the chart runs it) or as the lower layer of an overlay whose
upper layer (a tmpfs) records every file the command writes. ``/tmp`` is a fresh tmpfs (the chart
mounts an emptyDir there) holding copies of ``stage`` files; ``/dev`` gets null, zero, random and
urandom; ``/proc`` is mounted when the image has the directory. The command runs under
``chroot --userspec`` with exactly the image's environment (plus HOME from its /etc/passwd, as
runc sets it), in its working directory.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_SCRIPT = r"""
set -euo pipefail
root=$1 mode=$2 userspec=$3 stage=$4 upper_list=$5; shift 5
t=$(mktemp -d)
mount -t tmpfs -o mode=0700 tmpfs "$t"
m="$t/m"
mkdir "$m"
if [ "$mode" = ro ]; then
  mount --bind "$root" "$m"
  mount -o remount,bind,ro "$m"
else
  mkdir "$t/upper" "$t/work"
  mount -t overlay overlay -o "lowerdir=$root,upperdir=$t/upper,workdir=$t/work" "$m"
fi
if [ -d "$m/tmp" ]; then
  mount -t tmpfs -o mode=1777,size=64m tmpfs "$m/tmp"
  if [ -n "$stage" ]; then cp -r "$stage"/. "$m/tmp/"; chmod -R a+rX "$m/tmp"; fi
fi
if [ -d "$m/dev" ]; then
  mount -t tmpfs -o mode=0755,size=1m tmpfs "$m/dev"
  for d in null zero random urandom; do touch "$m/dev/$d"; mount --bind "/dev/$d" "$m/dev/$d"; done
fi
[ ! -d "$m/proc" ] || mount -t proc proc "$m/proc"
rc=0
/usr/bin/env -i "${ENV_FOR_IMAGE[@]}" /usr/sbin/chroot --userspec="$userspec" "$m" "$@" || rc=$?
if [ "$mode" = overlay ]; then
  (cd "$t/upper" && find . -mindepth 1 -printf '%y %P\n') > "$upper_list"
fi
exit $rc
"""


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str
    #: Overlay mode: every path the command created or changed in the image ("TYPE PATH", TYPE
    #: as find's %y), outside /tmp, /dev and /proc. Empty in read-only mode.
    written: list[str]

    def check(self, what: str = "command") -> Result:
        assert self.returncode == 0, (
            f"{what} exited {self.returncode}\nstdout:\n{self.stdout[-3000:]}\n"
            f"stderr:\n{self.stderr[-3000:]}"
        )
        return self


def _home_of(rootfs: Path, uid: str) -> str:
    try:
        for line in (rootfs / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[2] == uid:
                return fields[5]
    except OSError:
        pass
    return "/"


def run_in_image(
    rootfs: Path,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    user: str,
    workdir: str = "/",
    mode: str = "ro",
    stage: Mapping[str, Path] | None = None,
    timeout: float = 120,
) -> Result:
    """Run ``argv`` in ``rootfs`` as ``user`` ("UID:GID") with exactly ``env``.

    ``mode``: "ro" (read-only root filesystem) or "overlay" (writable; see :attr:`Result.written`).
    ``stage``: files or directories copied into the image's /tmp under the given names.
    ``workdir`` other than "/" needs the image's own /usr/bin/env (coreutils' ``env -C``).
    """
    if mode not in ("ro", "overlay"):
        raise ValueError(f"mode {mode!r}")
    full_env = dict(env)
    full_env.setdefault("HOME", _home_of(rootfs, user.split(":")[0]))
    command = list(argv)
    if workdir not in ("", "/"):
        command = ["/usr/bin/env", "-C", workdir, *command]
    with tempfile.TemporaryDirectory(prefix="gpuplace-sandbox-") as tmp:
        stage_dir = Path(tmp) / "stage"
        stage_dir.mkdir()
        for name, src in (stage or {}).items():
            if src.is_dir():
                shutil.copytree(src, stage_dir / name)
            else:
                shutil.copy(src, stage_dir / name)
        upper_list = Path(tmp) / "upper.txt"
        env_array = " ".join(_sh_quote(f"{k}={v}") for k, v in full_env.items())
        script = f"ENV_FOR_IMAGE=({env_array})\n{_SCRIPT}"
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", script, "sandbox",
             str(rootfs), mode, user, str(stage_dir), str(upper_list), *command],
            capture_output=True, text=True, errors="replace", timeout=timeout,
        )
        written: list[str] = []
        if mode == "overlay" and upper_list.exists():
            written = [ln for ln in upper_list.read_text().splitlines() if ln.strip()]
    return Result(proc.returncode, proc.stdout, proc.stderr, written)


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"
