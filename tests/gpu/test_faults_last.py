"""The runtime-API programs that end the omps server's context (programs.RT_FAULT_PROGRAMS:
kernel_fault, device_assert), run as the others are but after all of them: after each of
their omps runs the server must be ACTIVE again by itself within 10 s (else it is
restarted and the test fails). It exists so that what may disturb the server runs last
among the programs, as in scripts/gpu-e2e.sh before issue 24.
"""

import pytest

import programs
import e2e_rt

pytestmark = [pytest.mark.group("rt"), pytest.mark.phase(25)]


@pytest.mark.parametrize("prog", programs.RT_FAULT_PROGRAMS)
def test_fault_program(prog):
    e2e_rt.check_program(prog)
