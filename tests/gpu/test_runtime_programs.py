"""The runtime-API programs of tests/cuda/rt (programs.RT_PROGRAMS), each natively and under
omps both ways in: LD_PRELOAD, and LD_LIBRARY_PATH to a directory where libcuda.so.1 is
the shim; both outputs (and any assert messages) must equal native's. It exists as the
second family of the GPU harness (section 6 of scripts/gpu-e2e.sh before issue 24); a new
program is its .cu in tests/cuda/rt and its name in programs.RT_PROGRAMS (flags, if it
needs any, in programs.RT_FLAGS).
"""

import pytest

import programs
import e2e_rt

pytestmark = [pytest.mark.group("rt"), pytest.mark.phase(20)]


@pytest.mark.parametrize("prog", programs.RT_PROGRAMS)
def test_runtime_program(prog):
    e2e_rt.check_program(prog)
