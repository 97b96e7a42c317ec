"""Builds the C accelerator ``moderato._accel``; all metadata lives in pyproject.toml.

Warnings become errors only when MODERATO_STRICT_BUILD=1 (the Makefile, the
tools/ scripts and CI set it): a user's ``pip install`` on a compiler we never
tried must not fail on a warning that compiler invented.
"""

import os
import shutil
import sys
from glob import glob
from typing import Optional

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, ExecError, PlatformError

_GCC_STYLE_WARNINGS = ["-Wall", "-Wextra", "-Wno-missing-field-initializers"]

_COMPILER_HINT = """\
  Debian/Ubuntu:  sudo apt-get install build-essential python3-dev
  Fedora/RHEL:    sudo dnf install gcc python3-devel
  Alpine:         apk add build-base python3-dev
  macOS:          xcode-select --install
  Windows:        install "Build Tools for Visual Studio" with the "Desktop development with C++"
                  workload"""


def _strict() -> bool:
    return os.environ.get("MODERATO_STRICT_BUILD", "") not in ("", "0")


class BuildAccel(build_ext):
    """build_ext with warning flags per compiler, and one clear message for a missing toolchain."""

    def finalize_options(self) -> None:
        super().finalize_options()
        # The C files compile one per core (build_ext -j N still wins): a fresh
        # clone's `make demo` waits on this build.
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        if self.compiler.compiler_type != "msvc":  # MSVC takes other flags (/W4, /WX)
            # Only PyInit__accel (PyMODINIT_FUNC marks it) leaves the shared
            # object; MSVC exports nothing unmarked to begin with.
            flags = [*_GCC_STYLE_WARNINGS, "-fvisibility=hidden"]
            flags += ["-Werror"] if _strict() else []
            for extension in self.extensions:
                extension.extra_compile_args = flags + list(extension.extra_compile_args)
        try:
            super().build_extensions()
        except (CompileError, ExecError, PlatformError) as error:
            missing = self._missing_toolchain()
            if missing is None:
                raise  # the code itself failed to compile: the compiler's output says why
            sys.exit(
                f"error: moderato's C extension cannot be built here: {missing}.\n"
                f"Install a C compiler and the Python headers, then install again:\n"
                f"{_COMPILER_HINT}\n"
                f"(underlying error: {error})"
            )

    def _missing_toolchain(self) -> Optional[str]:
        """What part of the toolchain is absent, or None when it is all there."""
        if self.compiler.compiler_type == "msvc":
            if not getattr(self.compiler, "initialized", True):
                return "no Microsoft Visual C++ compiler was found"
            return None
        command = getattr(self.compiler, "compiler_so", None) or []
        if command and shutil.which(command[0]) is None:
            return f"the C compiler {command[0]!r} was not found"
        include_dirs = list(
            dict.fromkeys([*(self.include_dirs or []), *(self.compiler.include_dirs or [])])
        )
        if not any(os.path.isfile(os.path.join(path, "Python.h")) for path in include_dirs):
            searched = ", ".join(include_dirs) or "no include directory"
            return f"the Python headers (Python.h) were not found in {searched}"
        return None


setup(
    ext_modules=[
        Extension(
            "moderato._accel",
            sources=sorted(glob("csrc/*.c")),
            depends=sorted(glob("csrc/*.h")),
            include_dirs=["csrc"],
        )
    ],
    cmdclass={"build_ext": BuildAccel},
)
