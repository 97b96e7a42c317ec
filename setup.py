"""Builds the C accelerator ``moderato._accel``; all metadata lives in pyproject.toml."""

import shutil
import sys
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class build_py_with_lua(build_py):
    """Copy the top-level ``lua/`` scripts into the built package as ``moderato/lua``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "moderato" / "lua"
        target.mkdir(parents=True, exist_ok=True)
        for script in sorted((HERE / "lua").glob("*.lua")):
            shutil.copy2(script, target / script.name)


extra_compile_args = ["-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers"]
if sys.platform == "win32":  # pragma: no cover - MSVC takes other flags
    extra_compile_args = []

setup(
    ext_modules=[
        Extension(
            "moderato._accel",
            sources=sorted(glob("csrc/*.c")),
            depends=sorted(glob("csrc/*.h")),
            include_dirs=["csrc"],
            extra_compile_args=extra_compile_args,
        )
    ],
    cmdclass={"build_py": build_py_with_lua},
)
