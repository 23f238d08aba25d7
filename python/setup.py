"""Builds the trainsup client package (see pyproject.toml).

Two things are made at build time and never committed:
  * trainsup/v1/{supervisor,worker}_pb2{,_grpc}.py, generated from the
    repository's proto/trainsup/v1/*.proto with grpc_tools.protoc when the
    build environment has grpcio-tools (pip's isolated build installs it),
    else with the protoc and grpc_python_plugin programs (Debian's
    protobuf-compiler and protobuf-compiler-grpc, for
    `pip install --no-build-isolation`);
  * trainsup/_version.py, from the repository's file VERSION.

The declared grpcio and protobuf versions are those of the build
environment's runtime packages, which the generator matches: at least that
minor version, below the next major one. An sdist carries VERSION and the
.proto files, so it builds on its own.
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ("trainsup/v1/supervisor.proto", "trainsup/v1/worker.proto")


def _source(relative):
    """A file of the repository: beside this file in an sdist, one level up
    in the repository itself."""
    for base in (HERE, os.path.dirname(HERE)):
        path = os.path.join(base, relative)
        if os.path.exists(path):
            return path
    raise SystemExit("trainsup: %s not found next to %s or in the repository above it; build "
                     "the client from the trainsup repository (pip install ./python)" %
                     (relative, HERE))


def _proto_dir():
    """The folder that holds trainsup/v1/*.proto."""
    first = _source(os.path.join("proto", PROTOS[0]))
    return first[:-len(PROTOS[0])].rstrip(os.sep)


def _version():
    with open(_source("VERSION")) as f:
        version = f.read().strip()
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise SystemExit("trainsup: VERSION holds %r, not MAJOR.MINOR.PATCH" % version)
    return version


def _major_minor(version):
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise SystemExit("trainsup: cannot read a version from %r" % version)
    return int(m.group(1)), int(m.group(2))


def _requirement(name, runtime_version):
    major, minor = _major_minor(runtime_version)
    return "%s>=%d.%d,<%d" % (name, major, minor, major + 1)


def _dependencies():
    """grpcio and protobuf as the stubs need them (see the module doc)."""
    try:
        import grpc
        import google.protobuf
    except ImportError as e:
        raise SystemExit("trainsup: the build needs grpcio and protobuf (%s); pip's isolated "
                         "build brings them with grpcio-tools" % e)
    return [_requirement("grpcio", grpc.__version__),
            _requirement("protobuf", google.protobuf.__version__),
            "xxhash>=2.0"]


def _generate_stubs(out_dir):
    proto_dir = _proto_dir()
    args = ["--proto_path=" + proto_dir, "--python_out=" + out_dir,
            "--grpc_python_out=" + out_dir] + [os.path.join(proto_dir, p) for p in PROTOS]
    try:
        from grpc_tools import protoc
    except ImportError:
        protoc = None
    if protoc is not None:
        import importlib.resources
        include = str(importlib.resources.files("grpc_tools") / "_proto")
        if protoc.main(["grpc_tools.protoc", "--proto_path=" + include] + args) != 0:
            raise SystemExit("trainsup: grpc_tools.protoc failed on " + " ".join(PROTOS))
        return
    compiler = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if not compiler or not plugin:
        raise SystemExit("trainsup: generating the gRPC stubs needs grpcio-tools, or the protoc "
                         "and grpc_python_plugin programs (Debian: protobuf-compiler, "
                         "protobuf-compiler-grpc)")
    subprocess.run([compiler, "--plugin=protoc-gen-grpc_python=" + plugin] + args, check=True)


class BuildPy(build_py):
    def run(self):
        super().run()
        package_dir = os.path.join(self.build_lib, "trainsup")
        os.makedirs(package_dir, exist_ok=True)
        _generate_stubs(self.build_lib)
        with open(os.path.join(package_dir, "v1", "__init__.py"), "w") as f:
            f.write('"""gRPC stubs of proto/trainsup/v1, generated at build time."""\n')
        with open(os.path.join(package_dir, "_version.py"), "w") as f:
            f.write('"""Generated from the repository\'s VERSION at build time."""\n'
                    "__version__ = %r\n" % _version())


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        shutil.copy(_source("VERSION"), os.path.join(base_dir, "VERSION"))
        for p in PROTOS:
            target = os.path.join(base_dir, "proto", p)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(os.path.join(_proto_dir(), p), target)


setup(version=_version(), install_requires=_dependencies(),
      cmdclass={"build_py": BuildPy, "sdist": Sdist})
