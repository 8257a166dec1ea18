"""The installed package and the checkout agree: every package folder is installed, under one path per file."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str, mapping: dict[str, str]) -> Path:
    parts = package.split(".")
    for depth in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:depth])) in mapping:
            return ROOT / mapping[prefix] / Path(*parts[depth:])
    return ROOT / Path(*parts)


def test_every_package_folder_is_installed() -> None:
    config = _setuptools()
    mapping, listed = config["package-dir"], set(config["packages"])
    for package in listed:
        assert (_folder(package, mapping) / "__init__.py").is_file(), f"{package} is listed but has no __init__.py"
    roots = {package: _folder(package, mapping) for package in listed}
    found = set()
    for package, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder)
            found.add(".".join([package, *relative.parts]) if relative.parts else package)
    assert found - listed == set(), "sub-packages missing from pyproject.toml [tool.setuptools] packages"


def test_the_checkout_has_no_symlinks() -> None:
    files = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in files.splitlines() if line.startswith("120000")]
    assert links == [], f"tracked symlinks give a file two paths: {links}"


def test_modules_load_from_their_one_path() -> None:
    import tokenpools.proxy.app
    import tokenpools.topics

    assert Path(tokenpools.proxy.app.__file__) == ROOT / "proxy" / "app.py"
    assert Path(tokenpools.topics.__file__) == ROOT / "topics" / "__init__.py"


def test_the_dev_tooling_is_its_own_project_and_puts_only_tokenpools_dev_on_sys_path() -> None:
    import tokenpools_dev.devstack.kafka

    src = ROOT / "tools" / "src"
    assert Path(tokenpools_dev.devstack.kafka.__file__) == src / "tokenpools_dev" / "devstack" / "kafka.py"
    assert {p.name for p in src.iterdir() if not p.name.endswith(".egg-info")} == {"tokenpools_dev"}
    assert "openai" not in " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def test_the_installed_wheel_finds_the_example_configurations(tmp_path: Path) -> None:
    """`tokenpools demo` reads the paper's experiments from the package's data, not from a checkout."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(ROOT)], check=True, capture_output=True, cwd=tmp_path)
    probe = ("import tokenpools, tokenpools.replay.experiments as x; d = x.examples_dir(); "
             "print(tokenpools.__file__, d, (d / 'exp1.yaml').is_file(), (d / 'exp2.yaml').is_file())")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(site)}).stdout.split()
    assert out[0].startswith(str(site)) and out[1].startswith(str(site))
    assert out[2:] == ["True", "True"]


def test_no_two_test_files_share_a_name() -> None:
    """The tiers are folders without ``__init__.py``: pytest imports each test file by its base name, so two with one
    name (tests/unit/x.py and tests/component/x.py) stop a run of the whole suite at collection."""
    root = Path(__file__).resolve().parents[1]
    names = [p.name for p in root.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
