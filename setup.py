"""Builds the C accelerator ``moderato._accel``; all metadata lives in pyproject.toml."""

import sys
from glob import glob

from setuptools import Extension, setup


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
)
