"""Builds ruccl_pg: the Python package and its extension ruccl_pg._C (the C++ shim
in csrc/torch, linked with the ruCCL C core).

The C core is built first by CMake (target ruccl_static, in build/torch-core),
then the shim by torch's cpp_extension against the *installed* torch, so install
without build isolation:

    pip install --no-build-isolation .          # or: python setup.py build_ext --inplace

It needs cmake, ninja, a C/C++ compiler and OpenSSL's libcrypto headers
(scripts/setup.sh installs them on Debian/Ubuntu).
"""
import os
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_BUILD = os.path.join(ROOT, "build", "torch-core")
CORE_LIB = os.path.join(CORE_BUILD, "libruccl.a")


class BuildWithCore(BuildExtension):
    """Configures and builds the C core (incrementally) before the extension."""

    def run(self):
        if not os.path.exists(os.path.join(CORE_BUILD, "build.ninja")):
            subprocess.check_call(
                ["cmake", "-S", ROOT, "-B", CORE_BUILD, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DRUCCL_TESTS=OFF", "-DRUCCL_EXAMPLES=OFF", "-DRUCCL_ORCHESTRATOR=ON",
                 # the shim moves CUDA tensors through host copies itself and links no CUDA runtime
                 "-DRUCCL_CUDA=OFF"])
        subprocess.check_call(["cmake", "--build", CORE_BUILD, "--target", "ruccl_static"])
        super().run()


setup(
    name="ruccl_pg",
    version="0.1.0",
    description="ruCCL collective communication as a torch.distributed backend",
    packages=["ruccl_pg"],
    ext_modules=[
        CppExtension(
            name="ruccl_pg._C",
            sources=["csrc/torch/ProcessGroupRuccl.cpp", "csrc/torch/module.cpp"],
            include_dirs=[os.path.join(ROOT, "include")],
            extra_objects=[CORE_LIB],
            libraries=["crypto"],
            extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildWithCore},
    python_requires=">=3.9",
)
