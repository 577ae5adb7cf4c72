"""Build of the kvtier Python package: the pure-Python API and the kvtier._ext C extension,
linked statically against the library built by the repository's Makefile.

The library comes from $KVTIER_BUILD (a build directory holding libkvtier.a and config.mk),
by default ../build/default, which `make lib` creates when it is missing. No network.
"""
import os
import shlex
import subprocess

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("KVTIER_BUILD", os.path.join(ROOT, "build", "default")))


def library():
    """libkvtier.a and the link flags of its dependencies (from the build's config.mk)."""
    static = os.path.join(BUILD, "libkvtier.a")
    config = os.path.join(BUILD, "config.mk")
    if not (os.path.exists(static) and os.path.exists(config)):
        subprocess.check_call(["make", "-C", ROOT, "BUILD=" + BUILD, "lib"])
    libs = []
    with open(config) as f:
        for line in f:
            name, _, value = line.partition(":=")
            if name.strip() in ("DEP_LIBS", "URING_LIBS"):
                libs += shlex.split(value)
    return static, libs


static, libs = library()
ext = Extension(
    "kvtier._ext",
    sources=sorted(os.path.join("src", f) for f in os.listdir(os.path.join(HERE, "src"))
                   if f.endswith(".c")),
    include_dirs=[os.path.join(ROOT, "include")],
    extra_compile_args=["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wshadow",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
    extra_objects=[static],
    # the library's symbols stay inside the extension: another libkvtier in the process
    # (an engine's own) cannot collide with them
    extra_link_args=["-Wl,--exclude-libs,ALL"] + libs,
    depends=[os.path.join("src", "ext.h"), os.path.join("src", "dlpack_abi.h"), static],
)

setup(
    name="kvtier",
    version="0.1.0",
    description="Persistent prompt cache for LLM inference (Python binding of libkvtier)",
    packages=["kvtier"],
    package_data={"kvtier": ["py.typed"]},
    ext_modules=[ext],
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
