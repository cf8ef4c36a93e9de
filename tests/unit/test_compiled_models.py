"""A torch.compile'd model refuses bool() (OptimizedModule.__len__ raises): the probe finds, unwraps and
watches it without ever testing one for truth (issue 40: the probe died at a compiled Llama's first step)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pitstop.probe.environment import find_model, unwrap, wrapped_inside  # noqa: E402
from pitstop.probe.steps import ForwardWatch  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_compiled_module_refuses_bool_and_the_probe_unwraps_it() -> None:
    net = Net()
    compiled = torch.compile(net, backend="eager")  # lazy: nothing compiles until a call
    with pytest.raises(TypeError):
        bool(compiled)
    assert wrapped_inside(compiled) is net
    assert wrapped_inside(net) is None
    assert unwrap(compiled) is compiled or unwrap(compiled) is net  # no config inside: either is the model


def test_the_optimizer_finds_the_compiled_root_and_the_watch_reaches_inside() -> None:
    net = Net()
    compiled = torch.compile(net, backend="eager")
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    root = find_model(opt)
    assert root is compiled  # the outermost module: the one the job calls
    watch = ForwardWatch()
    watch.adopt(compiled)
    assert watch._inner is net
    assert watch.names == ("x",)
