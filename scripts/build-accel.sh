#!/usr/bin/env bash
# Compile the hot modules (tokenpools.accel.MODULES: admission, queue, replayer, simulator) with mypyc, in place (idempotent).
#
#   scripts/build-accel.sh            build if a source changed (else print "up to date" and exit)
#   scripts/build-accel.sh --force    rebuild anyway
#   scripts/build-accel.sh --clean    remove the compiled modules: back to pure Python
#   scripts/build-accel.sh --require  fail (exit 1) instead of skipping when mypyc or a C compiler is missing
#
# The extension modules land next to their sources (*.cpython-*.so, gitignored) with one shared library
# tokenpools/_accel__mypyc*.so and a record of the compiled sources' SHA-256, tokenpools/_accel.json; the C code
# and objects stay in build/accel. mypy names a module by its path, and the top-level folders are installed under
# tokenpools.* by a mapping (pyproject.toml), so the sources are compiled from a copy laid out as installed
# (build/accel/src/tokenpools/...). They are an accelerator, never a requirement: without mypy or a C compiler this
# script removes any compiled module it cannot rebuild and says so, and the pure-Python modules are used (same
# results). Each .so is put in place by rename, so a process that has the old one loaded keeps it intact.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-$VENV/bin/python}
exec "$PYTHON" - "$@" <<'PY'
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

from tokenpools.accel import MANIFEST_NAME, MODULES, source_path

ROOT = Path.cwd()
BUILD = ROOT / "build" / "accel"
STAGE = BUILD / "src"  # the compiled sources, copied into the installed layout
PACKAGE = ROOT / "tokenpools"
MANIFEST = PACKAGE / MANIFEST_NAME
GROUP = "tokenpools._accel"  # the shared library: tokenpools/_accel__mypyc<EXT_SUFFIX>
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def say(message: str) -> None:
    print(f"build-accel: {message}", flush=True)


def source(name: str) -> Path:  # where the checkout keeps it (the package mapping resolves the folder)
    return source_path(name).relative_to(ROOT)


def installed_packages() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def package_folder(package: str) -> Path:
    """The checkout's folder of an installed package, by the longest prefix in pyproject's package-dir mapping."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    parts = package.split(".")
    for depth in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:depth])) in mapping:
            return ROOT / mapping[prefix] / Path(*parts[depth:])
    return ROOT / Path(*parts)


def staged(name: str) -> Path:  # the copy mypy compiles, at the path that names it tokenpools.*
    return STAGE / Path(*name.split(".")).with_suffix(".py")


def extension(name: str) -> Path:  # also for a module that no longer exists (to remove what an old build left)
    package, _, short = name.rpartition(".")
    return package_folder(package).relative_to(ROOT) / (short + SUFFIX)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def toolchain() -> dict[str, str]:
    import mypy.version

    return {"python": sys.version, "platform": sysconfig.get_platform(), "mypy": mypy.version.__version__}


def recorded() -> dict:
    try:
        return json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return {}


def artefacts(manifest: dict) -> list[Path]:
    names = set(MODULES) | set(manifest.get("modules", {}))
    return [extension(n) for n in sorted(names)] + [Path(*GROUP.split(".")).with_name("_accel__mypyc" + SUFFIX)]


def clean(manifest: dict) -> int:
    MANIFEST.unlink(missing_ok=True)  # first: a partly removed build is never recorded as current
    removed = 0
    leftovers = [p.relative_to(ROOT) for package in installed_packages()  # e.g. of a module since renamed
                 for p in package_folder(package).glob("*" + SUFFIX)]
    for path in {*artefacts(manifest), *leftovers}:
        if path.exists():
            path.unlink()
            removed += 1
    return removed


def missing_prerequisite() -> str | None:
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypy (mypyc) is not installed in this environment (pip install mypy)"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc!r} is not on PATH)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "the Python headers (Python.h) are not installed"
    return None


def build() -> None:
    shutil.rmtree(BUILD / "lib", ignore_errors=True)  # only this build's extension modules get installed
    shutil.rmtree(STAGE, ignore_errors=True)
    for package in installed_packages():  # the whole installed tree: mypy follows the compiled modules' imports
        for path in package_folder(package).glob("*.py"):
            target = STAGE.joinpath(*package.split(".")) / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    script = f"""
import sys
from setuptools import setup
from mypyc.build import mypycify
paths = ["--follow-imports=silent", "--cache-dir={BUILD / 'mypy-cache'}", *{[str(staged(n).relative_to(STAGE)) for n in MODULES]!r}]
setup(name="tokenpools-accel", ext_modules=mypycify(paths, group_name={GROUP!r}, target_dir={str(BUILD / 'c')!r}),
      script_args=["-q", "build_ext", "--parallel", "2", "--build-lib", {str(BUILD / 'lib')!r},
                   "--build-temp", {str(BUILD / 'temp')!r}])
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=STAGE, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"build-accel: mypyc failed (exit {result.returncode}); the pure-Python modules stay in use")
    lib = BUILD / "lib"
    targets = {staged(n).relative_to(STAGE).with_name(n.rpartition(".")[2] + SUFFIX): extension(n) for n in MODULES}
    for built in sorted(lib.rglob("*" + SUFFIX)):
        relative = built.relative_to(lib)
        target = ROOT / targets.get(relative, relative)  # the group library: tokenpools/, the same in both
        staging = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.copy2(built, staging)
        os.replace(staging, target)  # a new inode: a process that loaded the old file keeps it


def verify() -> list[str]:
    """Import every module in a fresh interpreter; the ones that did not load from an extension."""
    probe = ("import json; from tokenpools import accel; "
             "print(json.dumps(sorted(set(accel.MODULES) - set(accel.compiled()))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/build-accel.sh")
    parser.add_argument("--force", action="store_true", help="rebuild even if nothing changed")
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules (pure Python again)")
    parser.add_argument("--require", action="store_true", help="fail instead of skipping without mypyc or a compiler")
    args = parser.parse_args()
    old = recorded()
    if args.clean:
        say(f"removed {clean(old)} compiled module file(s); the pure-Python modules are in use")
        return 0
    wanted = {"modules": {n: sha256(source(n)) for n in MODULES}}
    problem = missing_prerequisite()
    if problem is None:
        wanted["toolchain"] = toolchain()
    current = old == wanted and all(p.exists() for p in artefacts(old))
    if current and not args.force:
        say(f"up to date ({len(MODULES)} modules compiled)")
        return 0
    if problem is not None:
        removed = clean(old)
        say(f"skipped: {problem}; " + (f"removed {removed} stale compiled file(s); " if removed else "")
            + "the pure-Python modules are in use")
        return 1 if args.require else 0
    t0 = time.perf_counter()
    clean(old)
    build()
    not_compiled = verify()
    if not_compiled:
        clean(wanted)
        raise SystemExit(f"build-accel: built, but these did not import compiled: {not_compiled}; removed the build")
    MANIFEST.write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n")
    say(f"compiled {len(MODULES)} modules with mypyc in {time.perf_counter() - t0:.1f} s: "
        + ", ".join(n.rpartition('.')[2] for n in MODULES))
    return 0


sys.exit(main())
PY
