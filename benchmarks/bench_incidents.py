"""What following each pass for incidents costs the collector thread.

On the benchmark node of bench_agent.py (8 GPUs, 64 containers, 256 processes), passes
of the simulated node one (simulated) second apart are collected once, then the incident
watch (`exporter.incidents.watch.IncidentWatch`: the peaks of every GPU and workload, the
tracker's memory of each PID and of each workload's memory over the last minute, the
kernel log's poll) follows them as `l9gpu serve` has it do after every pass: CPU time of
one `observe`, median and p99: without a kernel log, with the `/dev/kmsg` reader polling a
kmsg-format file that gains nothing (`/dev/kmsg` is a read(2) as cheap), and with the
journal reader polling a journal directory that gains nothing.

Then each kernel-log reader alone, CPU time of one poll per pass: the `/dev/kmsg` reader
(`exporter.incidents.kmsg.KernelLog`) on the machine's own /dev/kmsg where it can be
read (a kmsg-format file otherwise) with nothing new, and on a kmsg-format file gaining
2,000 records between two polls (a second of a busy kernel: 1 in 100 an NVIDIA Xid line);
the journal reader (`exporter.incidents.journal.JournalKernelLog`) on a journal directory
gaining nothing, and gaining 2,000 kernel entries between two polls, written by
systemd-journal-remote (skipped where the binding or the tool is missing). Writing the
records is not timed. The journal's files are read by a child process of the reader
(`exporter.incidents.journal_reader`): a poll costs the pass only the read of its pipe, and
the child's own CPU time for those 2,000 entries (from /proc, 10 ms ticks, summed over the
loaded polls) and its resident memory are reported beside it.

Run: ``python benchmarks/bench_incidents.py`` (``--passes`` to change the sample size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_agent import CONTAINERS, GPUS, PROCESSES, scenario  # noqa: E402


def snapshots(path: Path, passes: int) -> list:
    from exporter.attribution import build_attributor
    from exporter.collect.collector import Collector
    from exporter.core.labels import label_schema
    from exporter.devices.simulated.backend import SimulatedBackend

    now = [1000.0]
    backend = SimulatedBackend(path, clock=lambda: now[0])
    backend.open()
    attributor = build_attributor(argparse.Namespace(), backend.node_name(), scenario=backend.scenario)
    _, labeller = label_schema(["team"])
    collector = Collector([backend], backend.node_name(), attributor=attributor, labeller=labeller,
                          clock=lambda: now[0])
    out = []
    try:
        for _ in range(passes):
            out.append(collector.collect_once())
            now[0] += 1.0
    finally:
        attributor.close()
    return out


def bench(snaps: list, kernel_logs: list[Path | str | None]) -> list[list[float]]:
    """CPU time of each watch's `observe`, one watch per kernel log, fed each snapshot in
    turn (so that a shared machine's load weighs on them alike)."""
    from exporter.core.labels import label_schema
    from exporter.incidents.engine import IncidentConfig, IncidentTracker
    from exporter.incidents.kmsg import KernelLog
    from exporter.incidents.watch import IncidentWatch

    names, labeller = label_schema(["team"])
    now = [1000.0]
    watches = []
    for kernel_log in kernel_logs:
        if isinstance(kernel_log, str):  # journal:DIR
            from exporter.incidents.journal import JournalKernelLog

            log: object = JournalKernelLog(kernel_log.partition(":")[2])
        else:
            log = KernelLog(str(kernel_log)) if kernel_log is not None else None
        watches.append(IncidentWatch("bench", labeller, names, tracker=IncidentTracker("bench", IncidentConfig()),
                                     kernel_log=log, clock=lambda: now[0]))
    times: list[list[float]] = [[] for _ in watches]
    for snap in snaps:
        for watch, spent in zip(watches, times):
            start = time.process_time()
            watch.observe(snap)
            spent.append(time.process_time() - start)
        now[0] += 1.0
    for watch in watches:
        watch.close()
    return [spent[60:] for spent in times]  # after the first minute: the growth window is full


RECORDS_PER_SECOND = 2000
LOADED_PASSES = 20


def _kernel_lines(n: int, pass_no: int) -> list[str]:
    lines = []
    for i in range(n):
        if i % 100 == 0:
            lines.append(f"NVRM: Xid (PCI:0000:3b:00): 31, pid={1000 + i}, name=python3, Ch 00000008, MMU Fault")
        else:
            lines.append(f"eth0: link up, 100Gbps, full duplex, flow control rx/tx ({pass_no}.{i})")
    return lines


def _timed_polls(reader, feed, passes: int) -> list[float]:
    times = []
    for n in range(passes):
        feed(n)
        start = time.process_time()
        reader.poll()
        times.append(time.process_time() - start)
    return times


def _report(title: str, times: list[float]) -> None:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"  {title:<58} CPU per poll: median {statistics.median(times) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms "
          f"(n={len(times)})")


def readers(tmp: Path, passes: int) -> None:
    import os

    from exporter.incidents.kmsg import KernelLog, KernelLogUnavailable

    print(f"kernel-log readers alone, one poll per pass; loaded: {RECORDS_PER_SECOND} records between two polls")
    try:
        device = KernelLog("/dev/kmsg")
        _report("/dev/kmsg reader, the machine's /dev/kmsg, idle", _timed_polls(device, lambda n: None, passes))
        device.close()
    except KernelLogUnavailable as exc:
        print(f"  /dev/kmsg reader, the machine's /dev/kmsg: not measured ({exc})")
    kmsg = tmp / "kmsg-readers"
    kmsg.write_text("")
    seq = [0]

    def feed_kmsg(n: int) -> None:
        with kmsg.open("a") as f:
            for line in _kernel_lines(RECORDS_PER_SECOND, n):
                seq[0] += 1
                f.write(f"4,{seq[0]},{int(time.monotonic() * 1e6)},-;{line}\n")

    sys.path.insert(0, str(REPO / "tests"))
    from journal_helpers import append_entries, journal_unavailable, kernel_entry

    log = KernelLog(str(kmsg))
    journal = None
    if journal_unavailable():
        print(f"  journal reader: not measured ({journal_unavailable()})")
    else:
        from exporter.incidents.journal import JournalKernelLog

        directory = tmp / "journal" / "0123456789abcdef0123456789abcdef"
        os.makedirs(directory)
        path = directory / "system.journal"
        append_entries(path, [kernel_entry("Linux version 6.8.0")])
        journal = JournalKernelLog(str(tmp / "journal"))

    def feed_journal(n: int) -> None:
        now = time.monotonic()
        append_entries(path, [kernel_entry(line, now) for line in _kernel_lines(RECORDS_PER_SECOND, n)])

    # the two readers alternate, pass by pass, so that a shared machine's load weighs on them alike
    idle: dict[str, list[float]] = {"kmsg": [], "journal": []}
    loaded: dict[str, list[float]] = {"kmsg": [], "journal": []}
    for _ in range(passes):
        idle["kmsg"] += _timed_polls(log, lambda n: None, 1)
        if journal is not None:
            idle["journal"] += _timed_polls(journal, lambda n: None, 1)
    child_before = _child_cpu(journal)
    for n in range(LOADED_PASSES):
        loaded["kmsg"] += _timed_polls(log, lambda _, n=n: feed_kmsg(n), 1)  # type: ignore[misc]
        if journal is not None:
            # written, then read by the child (not timed: another process), then the pass's poll
            loaded["journal"] += _timed_polls(journal, lambda _, n=n: (feed_journal(n), _synced(journal)), 1)
    child_cpu = _child_cpu(journal) - child_before
    _report("/dev/kmsg reader, kmsg-format file, idle", idle["kmsg"])
    _report(f"/dev/kmsg reader, kmsg-format file, {RECORDS_PER_SECOND} records a pass", loaded["kmsg"])
    log.close()
    if journal is not None:
        _report("journal reader, idle", idle["journal"])
        _report(f"journal reader, {RECORDS_PER_SECOND} kernel entries a pass", loaded["journal"])
        print(f"  {'journal reader child, ' + str(RECORDS_PER_SECOND) + ' kernel entries':<58} its CPU per batch: "
              f"{child_cpu / LOADED_PASSES * 1e3:.1f} ms (mean of {LOADED_PASSES}); resident "
              f"{_child_rss_mib(journal):.1f} MiB")
        assert journal.counts()["xid"] == LOADED_PASSES * RECORDS_PER_SECOND // 100
        journal.close()


def _synced(journal) -> None:
    if hasattr(journal, "sync"):  # the reader of a child process: let it read what was written
        journal.sync()


def _child_pid(journal) -> int | None:
    proc = getattr(journal, "_proc", None)
    return proc.pid if proc is not None else None


def _child_cpu(journal) -> float:
    """The journal reader's child's CPU seconds so far (0 where it has none)."""
    import os

    pid = _child_pid(journal) if journal is not None else None
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child_rss_mib(journal) -> float:
    pid = _child_pid(journal)
    if pid is None:
        return 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=600, help="passes followed (the first 60 are not timed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = scenario(Path(tmp) / "node.yaml")
        snaps = snapshots(path, args.passes)
        kmsg = Path(tmp) / "kmsg"
        kmsg.write_text("6,1,1,-;an unrelated line\n")
        print(f"node: {GPUS} GPUs, {CONTAINERS} containers, {PROCESSES} processes; {args.passes} passes "
              "a second apart, the first 60 untimed")
        sources: list[tuple[str, Path | str | None]] = [("incident watch, no kernel log", None),
                                                         ("incident watch, idle kmsg reader", kmsg)]
        sys.path.insert(0, str(REPO / "tests"))
        from journal_helpers import append_entries, journal_unavailable, kernel_entry

        if not journal_unavailable():
            journal = Path(tmp) / "watch-journal"
            append_entries(journal / "0123456789abcdef0123456789abcdef" / "system.journal",
                           [kernel_entry("Linux version 6.8.0")])
            sources.append(("incident watch, idle journal reader", f"journal:{journal}"))
        for (title, _), times in zip(sources, bench(snaps, [log for _, log in sources])):
            times = sorted(times)
            p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
            print(f"  {title:<36} CPU per pass: median {statistics.median(times) * 1e3:.3f} ms, "
                  f"p99 {p99 * 1e3:.3f} ms (n={len(times)})")
        readers(Path(tmp), min(args.passes, 600))
    return 0


if __name__ == "__main__":
    sys.exit(main())
