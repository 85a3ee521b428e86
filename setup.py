"""setuptools glue for `pip install .`: the extension module is built by CMake.

The package's Python files come from python/asyncinfer/; the native module (and libasyncinfer,
when it is a shared library) is built by CMake target `asyncinfer_python` and installed next to
them by `cmake --install <build> --component python`.

Environment:
  ASYNCINFER_CMAKE_BUILD_DIR  reuse an existing, configured build tree (e.g. build/release, with
                              the python module on) instead of configuring build/pip; the test
                              suite uses this so that checking `pip install .` costs seconds.
  CMAKE_ARGS                  extra configure arguments for build/pip (e.g. -DASYNCINFER_WITH_CUDA=OFF)
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default: all cores)
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
SCRATCH = os.path.join(ROOT, "build", "setuptools")


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        package_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        prefix = os.path.dirname(package_dir)
        build_dir = os.environ.get("ASYNCINFER_CMAKE_BUILD_DIR")
        if build_dir:
            build_dir = os.path.abspath(build_dir)
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                sys.exit(f"ASYNCINFER_CMAKE_BUILD_DIR={build_dir} is not a configured CMake build")
        else:
            build_dir = os.path.join(ROOT, "build", "pip")
            self.configure(build_dir)
        if not os.path.isdir(os.path.join(build_dir, "python")):
            sys.exit("CMake did not enable the Python module in " + build_dir + ": it needs "
                     "pybind11, the Python headers and dlpack.h (Debian: scripts/setup.sh installs "
                     "pybind11-dev python3-dev libdlpack-dev); see the configure output above")
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        self.run_cmd(["cmake", "--build", build_dir, "--target", "asyncinfer_python", "-j", jobs])
        self.run_cmd(["cmake", "--install", build_dir, "--component", "python", "--prefix", prefix])

    def configure(self, build_dir):
        args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                "-DASYNCINFER_WITH_PYTHON=ON", "-DASYNCINFER_BUILD_TESTS=OFF",
                "-DASYNCINFER_BUILD_BENCH=OFF", "-DASYNCINFER_BUILD_APPS=OFF",
                f"-DPython_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        self.run_cmd(args)

    @staticmethod
    def run_cmd(args):
        print("+ " + " ".join(shlex.quote(a) for a in args), flush=True)
        subprocess.run(args, check=True)


os.makedirs(SCRATCH, exist_ok=True)
setup(
    packages=["asyncinfer"],
    package_dir={"": "python"},
    package_data={"asyncinfer": ["*.pyi", "py.typed"]},
    ext_modules=[CMakeExtension("asyncinfer._asyncinfer")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
    options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}},
)
