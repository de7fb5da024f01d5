"""One licence for the repository: the root LICENSE (Apache-2.0), copied into each
package so that its wheel and sdist carry it, and declared the same way by every
package's pyproject."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())


def test_root_license_is_apache_2_with_the_projects_copyright() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "   Copyright inkling-sconv authors\n" in text
    assert "[yyyy]" not in text and "[name of copyright owner]" not in text


def test_there_are_packages_to_check() -> None:
    assert [p.name for p in PACKAGES] == ["inkling-cache", "inkling-kernels", "inkling-model", "inkling-vllm"]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_each_package_carries_and_declares_the_root_license(package: Path) -> None:
    assert (package / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes(), \
        f"{package.name}/LICENSE differs from the root LICENSE: copy it again"
    project = tomllib.loads((package / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project.get("license") == "Apache-2.0"
    assert project.get("license-files") == ["LICENSE"]
