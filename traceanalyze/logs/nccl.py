"""NCCL_DEBUG=INFO lines, in a file of their own or mixed into a training log: the NCCL version, each channel's
transport (``P2P``, ``SHM``, ``NET``, ``COLLNET``), the networks, the ``NCCL_*`` settings and the communicator size.
"""

from __future__ import annotations

import re

from traceanalyze.logs.model import NcclChannel, NcclInfo
from traceanalyze.logs.state import LogState

_NCCL_CHANNEL = re.compile(
    r"^(?P<host>[^:\s]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO "
    r"Channel (?P<ch>\d+)(?:/(?P<sub>\d+))? : "
    r"(?P<src>\d+)\[(?P<srcdev>[0-9a-f]+)\] -> (?P<dst>\d+)\[(?P<dstdev>[0-9a-f]+)\] "
    r"(?:\[(?P<dir>send|receive)\] )?via (?P<transport>P2P|SHM|NET|COLLNET)/(?P<detail>.+?)\s*$"
)
_NCCL_VERSION = re.compile(r"NCCL version[: ]+(\d+\.\d+(?:\.\d+)?)")
_NCCL_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_NCCL_ENV = re.compile(r"NCCL INFO (NCCL_\w+) set by environment to (.*?)\.?\s*$")
_NCCL_COMM = re.compile(r"NCCL INFO comm 0x[0-9a-fA-F]+ rank \d+ n[Rr]anks (\d+)")


class NcclLines:
    """The NCCL lines of one log: :attr:`info` holds what they say; each channel line is kept once."""

    def __init__(self, log: LogState) -> None:
        self.log = log
        self.info = NcclInfo()
        self.seen = False  # any NCCL INFO/WARN line
        self._chan_seen: set[NcclChannel] = set()

    @staticmethod
    def wants(s: str) -> bool:
        return "NCCL" in s

    def line(self, lineno: int, s: str, rank: int | None) -> bool:
        """Read one NCCL line; never takes the line from the families after it."""
        if "NCCL INFO" in s or "NCCL WARN" in s:
            self.seen = True
        m = _NCCL_CHANNEL.match(s)
        if m:
            self._channel(m)
            return False
        m = _NCCL_VERSION.search(s)
        if m:
            self.seen = True
            if self.info.version is None:
                self.info.version = m.group(1)
            self.log.fact("nccl_version", m.group(1), lineno)
            return False
        m = _NCCL_NETWORK.search(s)
        if m:
            if m.group(1) not in self.info.networks:
                self.info.networks.append(m.group(1))
            return False
        m = _NCCL_ENV.search(s)
        if m:
            self.info.env.setdefault(m.group(1), m.group(2))
            return False
        m = _NCCL_COMM.search(s)
        if m:
            self.info.nranks = max(self.info.nranks or 0, int(m.group(1)))
        return False

    def _channel(self, m: re.Match[str]) -> None:
        transport = m.group("transport")
        ch = NcclChannel(
            host=m.group("host"),
            pid=int(m.group("pid")),
            device=int(m.group("dev")),
            channel=int(m.group("ch")),
            src_rank=int(m.group("src")),
            dst_rank=int(m.group("dst")),
            direction=m.group("dir"),
            transport=transport,
            detail=f"{transport}/{m.group('detail')}",
        )
        if ch not in self._chan_seen:
            self._chan_seen.add(ch)
            self.info.channels.append(ch)

    def finish(self) -> NcclInfo | None:
        """What the NCCL lines said, or None when the log had none."""
        return self.info if self.seen or self.info.channels else None
