"""What docs/plugins.md section 8 tells a plugin author to write, for a backend that keeps its state
in PluginState (the simulator is the model): the hypervisor contract through public API only."""

import pytest

from vpsshop.testing import HypervisorContract
from vpsshop_simulator import SimulatedBackend


class TestABackendModelledOnTheSimulator(HypervisorContract):
    @pytest.fixture
    def hypervisor_backend(self, vpsshop_context, hypervisor_run):
        backend = SimulatedBackend.from_settings(
            {"boot_seconds": 0.2, "hosts": ["sim-a", "sim-b"]}, sandbox=True, where="hypervisor.mine"
        )
        backend.bind(vpsshop_context)
        yield backend
        hypervisor_run(backend.close())

    @pytest.fixture
    def hypervisor_boot_timeout(self):
        return 10


def test_the_docs_and_the_kit_show_the_same_fixture():
    """docs/plugins.md and the kit's docstring give a plugin author one way to set the kit up."""
    import textwrap
    from pathlib import Path

    from vpsshop.servers import contract

    docs = (Path(__file__).parent.parent / "docs" / "plugins.md").read_text()
    after_marker = docs.split("<!-- hypervisor kit fixture: the same in vpsshop/servers/contract.py -->", 1)[1]
    in_docs = after_marker.split("```python\n", 1)[1].split("```", 1)[0]
    docstring = contract.__doc__ or ""
    block = docstring.split("so a failure names the rule that broke::\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("       "):
            break
        lines.append(line)
    in_kit = textwrap.dedent("\n".join(lines)).strip() + "\n"
    assert in_kit == in_docs
