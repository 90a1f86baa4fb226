"""Run nvitop-exporter on the same fake node as `fake_nvml_agent` (the agent's peer).

nvitop reaches below pynvml's functions where it can (``_nvmlGetFunctionPointer``, to
call versioned C functions itself). Here ``import pynvml`` gives the installed
nvidia-ml-py module with every NVML function replaced: those the tests' fake has answer
from the fake node, charging the H200 costs (``--h200-costs``) as they do for the agent;
the others answer NOT_SUPPORTED at no cost, which can only make the peer cheaper
than on a real driver. Without the function-pointer lookup nvitop calls pynvml's own
functions, as it does with a binding that lacks it. The fake's errors are the binding's
exception classes, so nvitop handles them as a driver's.

Usage (what benchmarks/bench_agent.py ``--peer`` runs)::

    python benchmarks/fake_nvml_peer.py SCENARIO [--h200-costs] -- --bind-address 127.0.0.1 --port 9901

nvitop-exporter and nvitop must be importable (``pip install nvitop-exporter``, or a
``--target`` directory on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))


# The NVML functions the peer asked that the fake does not have (for the record).
MISSING: set[str] = set()


def binding_on_fake(fake: object) -> types.ModuleType:
    """nvidia-ml-py's module, each NVML function answered by ``fake`` or not found."""
    import pynvml as real  # nvidia-ml-py
    from fakes import pynvml_fake

    # The fake raises NVMLError(code): make that the binding's class (its __new__ picks
    # the subclass for the code, e.g. NVMLError_NotSupported), so nvitop catches it.
    pynvml_fake.NVMLError = real.NVMLError  # type: ignore[misc]

    def missing(name: str):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if name not in MISSING:
                MISSING.add(name)
                print(f"fake node: {name} is not in the fake, answered NOT_SUPPORTED", file=sys.stderr)
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        call.__name__ = name
        return call

    module = types.ModuleType("pynvml")
    module.__dict__.update({k: v for k, v in vars(real).items() if k not in ("__name__", "__spec__", "__loader__")})
    own = set(dir(type(fake)))
    for name, value in vars(real).items():
        if not (name.startswith("nvml") and isinstance(value, types.FunctionType)):
            continue
        if name in own:
            setattr(module, name, getattr(fake, name))
        elif "_nvmlGetFunctionPointer" in value.__code__.co_names:  # a call into the C library
            setattr(module, name, missing(name))
    module._nvmlGetFunctionPointer = None  # type: ignore[attr-defined]
    return module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s SCENARIO [--h200-costs] -- NVITOP_EXPORTER_ARGS...")
    parser.add_argument("scenario")
    parser.add_argument("--h200-costs", action="store_true", help="charge every NVML call its H200 cost")
    opts = parser.parse_args(own)
    from fake_nvml_agent import fake_node

    from exporter.devices.simulated.backend import load_scenario

    fake = fake_node(load_scenario(opts.scenario), opts.h200_costs)
    sys.modules["pynvml"] = binding_on_fake(fake)
    from nvitop_exporter.cli import main as peer_main

    sys.argv = ["nvitop-exporter", *rest]
    return int(peer_main() or 0)


if __name__ == "__main__":
    raise SystemExit(main())
