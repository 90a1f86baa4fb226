"""The model's hand-written constructors say what the generated ones would."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from exporter.core.model import UNKNOWN, DeviceSample, ProcessRow, ProcessSample, WorkloadUsage


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty


@pytest.mark.parametrize("cls", [ProcessSample, ProcessRow, WorkloadUsage, DeviceSample])
def test_a_one_step_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [_default(f) for f in fields]


def test_a_device_sample_made_in_one_step_is_the_frozen_dataclass_it_was() -> None:
    device = DeviceSample(0, "GPU-a", utilization=0.5, processes=(ProcessSample(7),))
    assert device == DeviceSample(index=0, uuid="GPU-a", utilization=0.5, processes=(ProcessSample(7),))
    assert device.key == "GPU-a" and device.up and device.gpm == {} and device.capacity == 1.0
    assert dataclasses.replace(device, up=False).up is False and device.up
    assert vars(device)["processes"][0].pid == 7 and len(vars(device)) == len(dataclasses.fields(DeviceSample))
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.up = False  # type: ignore[misc]


def test_one_step_instances_are_frozen_dataclasses_like_any_other() -> None:
    sample = ProcessSample(7, 1024)
    assert vars(sample) == {"pid": 7, "used_memory_bytes": 1024, "sm_utilization": None,
                            "memory_utilization": None, "kind": "compute"}
    assert sample == ProcessSample(pid=7, used_memory_bytes=1024) and hash(sample) == hash(ProcessSample(7, 1024))
    assert dataclasses.replace(sample, sm_utilization=0.5).sm_utilization == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.pid = 8  # type: ignore[misc]
    row = ProcessRow("GPU-0", 7, "python", UNKNOWN, 1024, None)
    assert row.start_time is None and dataclasses.asdict(row)["comm"] == "python"
    assert repr(row).startswith("ProcessRow(device_key='GPU-0', pid=7, comm='python'")
