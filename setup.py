"""Builds the Cython extensions in shmq/_fast with the system compiler.

Environment knobs (MagicStack style):
  SHMQ_DEBUG=1     -O0 -g, bounds checks on, Cython line tracing
  SHMQ_SANITIZE=1  AddressSanitizer + UBSan (run python with LD_PRELOAD=$(gcc -print-file-name=libasan.so))
  SHMQ_ANNOTATE=1  write Cython HTML annotations next to the sources
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("SHMQ_DEBUG") == "1"
SANITIZE = os.environ.get("SHMQ_SANITIZE") == "1"

compile_args = ["-O0", "-g"] if DEBUG else ["-O3"]
link_args: list[str] = []
if SANITIZE:
    compile_args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    link_args += ["-fsanitize=address,undefined"]
directives = {"language_level": "3", "embedsignature": True}
if DEBUG:
    directives.update({"boundscheck": True, "wraparound": True, "linetrace": True})

extensions = [
    Extension(
        f"shmq._fast.{name}",
        [f"shmq/_fast/{name}.pyx"],
        include_dirs=["shmq/_fast"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
    )
    for name in ("crc32c", "batch", "index", "mapping", "seqlock", "wire", "metrics", "ring", "producers", "client", "worker_ring")
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        annotate=os.environ.get("SHMQ_ANNOTATE") == "1",
    )
)
