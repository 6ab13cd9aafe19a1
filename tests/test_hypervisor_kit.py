"""What docs/plugins.md section 8 tells a plugin author to write, for a backend that keeps its state
in PluginState (the simulator is the model): the hypervisor contract through public API only."""

import pytest

from vpsshop.testing import HypervisorContract
from vpsshop_simulator import SimulatedBackend


class TestABackendModelledOnTheSimulator(HypervisorContract):
    @pytest.fixture
    def hypervisor_backend(self, vpsshop_context, hypervisor_run):
        backend = SimulatedBackend.from_settings({"boot_seconds": 0.2}, sandbox=True, where="hypervisor.mine")
        backend.bind(vpsshop_context)
        yield backend
        hypervisor_run(backend.close())

    @pytest.fixture
    def hypervisor_boot_timeout(self):
        return 10
