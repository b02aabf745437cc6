"""A Debian bookworm root filesystem from .deb packages, with no base image and no debootstrap:
the base the offline image builder (:mod:`multislice_local.images`) puts under both images.

apt-get resolves and downloads the dependency closure of the packages asked for, under an apt
configuration of its own (Debian bookworm, bookworm-updates and bookworm-security from
deb.debian.org, signatures checked with the Debian archive keyring; its lists, status and
archives in the cache, nothing of the host's apt state read or written). ``dpkg-deb -x`` unpacks
each package, in name order. Maintainer scripts do not run; what they would make that a Python
program needs is written here instead: ``/etc/passwd`` and ``/etc/group`` (base-passwd's master
files), the CA bundle ``/etc/ssl/certs/ca-certificates.crt`` and its ``.pem`` links
(update-ca-certificates), and ``/var/lib/dpkg/status`` so that scanners see the packages. Manual
pages, info, locales and documentation other than the copyright files are left out, as Debian's
slim images do.

The same packages give the same tree: the downloaded files are named and hashed (their sha256
goes into the image builder's cache key).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
ARCH = "amd64"
# The apt lists are refreshed when older than this (a day): a Debian update then shows as new
# package versions, which change the image builder's cache key. A failed refresh keeps the old
# lists (with a warning) when there are some.
LISTS_MAX_AGE_S = 24 * 3600
# Left out of the root filesystem (Debian's slim images drop the same): directories under usr/share.
DROPPED_SHARE = ("man", "info", "locale", "lintian", "linda", "bug", "doc-base")


# apt-get --simulate: "Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []"
_INST = re.compile(r"^Inst (?P<name>\S+) \((?P<version>\S+) .*\[(?P<arch>[a-z0-9]+)\]\)")


class DebianError(RuntimeError):
    """The packages could not be resolved, downloaded or unpacked (the message says why)."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    path: Path  # the .deb in the cache's archives
    sha256: str


def _run(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, env=env, check=False, timeout=900
        )
    except FileNotFoundError as exc:
        raise DebianError(
            f"{argv[0]} is not installed: the image builder needs apt and dpkg-deb "
            "(a Debian or Ubuntu host)"
        ) from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).splitlines()[-15:])
        raise DebianError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}):\n{tail}")
    return done.stdout


class Apt:
    """apt-get with a configuration, lists and archives of its own under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.archives = root / "archives"
        self.lists = root / "lists"
        self._config = root / "apt.conf"

    def _write_config(self) -> None:
        if not KEYRING.is_file():
            raise DebianError(
                f"{KEYRING} is missing: install Debian's archive keyring "
                "(apt-get install debian-archive-keyring) so that apt can check the packages"
            )
        etc = self.root / "etc"
        for d in (etc / "apt.conf.d", etc / "preferences.d", etc / "sources.list.d",
                  self.lists / "partial", self.archives / "partial"):  # fmt: skip
            d.mkdir(parents=True, exist_ok=True)
        status = self.root / "status"
        if not status.exists():  # touched, it would make apt rebuild its cache every time
            status.touch()  # empty: apt resolves as for an empty system, the whole closure
        signed = f"[signed-by={KEYRING}]"
        _write_if_changed(
            etc / "sources.list",
            f"deb {signed} {MIRROR} {SUITE} main\n"
            f"deb {signed} {MIRROR} {SUITE}-updates main\n"
            f"deb {signed} {SECURITY_MIRROR} {SUITE}-security main\n",
        )
        settings = {
            "Dir": "/",
            "Dir::Etc": etc,
            "Dir::Etc::sourcelist": etc / "sources.list",
            "Dir::Etc::sourceparts": etc / "sources.list.d",
            "Dir::Etc::parts": etc / "apt.conf.d",
            "Dir::Etc::preferencesparts": etc / "preferences.d",
            "Dir::State": self.root,
            "Dir::State::Lists": self.lists,
            "Dir::State::status": status,
            "Dir::Cache": self.root,
            "Dir::Cache::archives": self.archives,
            "APT::Architecture": ARCH,
            "APT::Install-Recommends": "false",
            "APT::Sandbox::User": "root" if os.geteuid() == 0 else "",
            "Acquire::Languages": "none",
        }
        _write_if_changed(
            self._config, "".join(f'{k} "{v}";\n' for k, v in settings.items() if v != "")
        )

    def _apt(self, *args: str) -> str:
        env = {**os.environ, "APT_CONFIG": str(self._config), "LC_ALL": "C"}
        return _run(["apt-get", "-q", *args], env=env)

    def update(self, max_age_s: float = LISTS_MAX_AGE_S) -> str:
        """Refresh the package lists when missing or older than `max_age_s`; says what it did."""
        self._write_config()
        stamp = self.lists / ".updated"
        if stamp.exists() and time.time() - stamp.stat().st_mtime < max_age_s:
            return "package lists up to date"
        try:
            self._apt("update")
        except DebianError as exc:
            if not stamp.exists():
                raise DebianError(f"apt-get update (Debian's mirror, {MIRROR}): {exc}") from exc
            return f"WARNING: apt-get update failed, using the lists of before: {exc}"
        stamp.touch()
        return "package lists refreshed from deb.debian.org"

    def resolve(self, names: Sequence[str]) -> list[tuple[str, str, str]]:
        """The closure of `names` as (package, version, architecture), from apt's simulation
        of installing them on an empty system."""
        out = self._apt("install", "--simulate", "-qq", "-y", *names)
        found = []
        for line in out.splitlines():
            match = _INST.match(line)
            if match:
                found.append((match["name"], match["version"], match["arch"]))
        if not found:
            raise DebianError(f"apt-get resolved nothing for {list(names)}: {out[-500:]}")
        return found

    def download(self, names: Sequence[str]) -> list[Package]:
        """The closure of `names`, downloaded (apt checks each file against the signed lists)
        unless already in the archives, sorted by package name."""
        wanted = self.resolve(names)
        files = [
            self.archives / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
            for name, version, arch in wanted
        ]
        if not all(f.is_file() for f in files):
            self._apt("install", "--download-only", "-qq", "-y", *names)
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise DebianError(f"apt-get install --download-only left {missing} missing")
        packages = [
            Package(name, version, path, file_sha256(path))
            for (name, version, _), path in zip(wanted, files, strict=True)
        ]
        return sorted(packages, key=lambda p: p.name)


def _write_if_changed(path: Path, text: str) -> None:
    """apt rebuilds its package cache (seconds) when its configuration files are newer."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def unpack(packages: Sequence[Package], root: Path) -> None:
    """Every package's files into `root`, then what their maintainer scripts would have made."""
    root.mkdir(parents=True, exist_ok=True)
    for package in packages:
        _run(["dpkg-deb", "-x", str(package.path), str(root)])
    _drop_docs(root)
    _write_users(root)
    _write_ca_bundle(root)
    _write_status(packages, root)


def _drop_docs(root: Path) -> None:
    share = root / "usr" / "share"
    for name in DROPPED_SHARE:
        shutil.rmtree(share / name, ignore_errors=True)
    for doc in sorted((share / "doc").glob("*")):
        if doc.is_dir() and not doc.is_symlink():
            for entry in doc.iterdir():
                if entry.name != "copyright":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _write_users(root: Path) -> None:
    """base-passwd's postinst: the master files become /etc/passwd and /etc/group."""
    master = root / "usr" / "share" / "base-passwd"
    if not (master / "passwd.master").is_file():
        raise DebianError("base-passwd is not among the packages: /etc/passwd would be missing")
    for name in ("passwd", "group"):
        shutil.copyfile(master / f"{name}.master", root / "etc" / name)
        (root / "etc" / name).chmod(0o644)


def _write_ca_bundle(root: Path) -> None:
    """update-ca-certificates with every certificate enabled (ca-certificates' default):
    /etc/ca-certificates.conf, /etc/ssl/certs/<name>.pem links and the bundle, which
    OpenSSL's default CA file (/usr/lib/ssl/cert.pem) links to."""
    store = root / "usr" / "share" / "ca-certificates"
    certs = sorted(p.relative_to(store).as_posix() for p in store.rglob("*.crt"))
    if not certs:
        return
    (root / "etc" / "ca-certificates.conf").write_text("".join(f"{c}\n" for c in certs))
    out = root / "etc" / "ssl" / "certs"
    out.mkdir(parents=True, exist_ok=True)
    bundle = []
    for cert in certs:
        pem = (store / cert).read_text()
        bundle.append(pem if pem.endswith("\n") else pem + "\n")
        link = out / (Path(cert).stem + ".pem")
        link.unlink(missing_ok=True)
        link.symlink_to(f"/usr/share/ca-certificates/{cert}")
    (out / "ca-certificates.crt").write_text("".join(bundle))


def _write_status(packages: Sequence[Package], root: Path) -> None:
    """/var/lib/dpkg/status: each package's control fields, installed (what dpkg would say)."""
    entries = []
    for package in packages:
        control = _run(["dpkg-deb", "-f", str(package.path)]).rstrip("\n")
        first, _, rest = control.partition("\n")
        entries.append(f"{first}\nStatus: install ok installed\n{rest}\n")
    status = root / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n".join(entries))
