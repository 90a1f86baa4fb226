"""The model's hand-written constructors say what the generated ones would."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from exporter.core.model import UNKNOWN, ProcessRow, ProcessSample, WorkloadUsage


@pytest.mark.parametrize("cls", [ProcessSample, ProcessRow, WorkloadUsage])
def test_a_one_step_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields]


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
