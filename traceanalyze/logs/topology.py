"""``nvidia-smi topo -m`` output: the GPU/NIC link matrix (:func:`parse_topology`). What each link class means
and carries is in :mod:`traceanalyze.hardware`."""

from __future__ import annotations

import re
from pathlib import Path

from traceanalyze.logs.model import TopoLink, Topology
from traceanalyze.logs.read import iter_lines

_DEVICE_RE = re.compile(r"^(?:GPU\d+|NIC\d+|mlx5_\d+)$")
_LINK_RE = re.compile(r"^(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_HEADER_TOKEN = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


def parse_topology(path: Path, max_bytes: int | None = None) -> Topology:
    """Parse ``nvidia-smi topo -m`` output (tab- or space-separated).

    The header row gives the column order (``GPU0``.., ``NIC0``/``mlx5_0``.., then ``CPU Affinity``,
    ``NUMA Affinity``, ``GPU NUMA ID`` when present); rows ``GPUn``/``NICn``/``mlx5_n`` give one cell per
    device (``X``, ``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``; ``SOC`` in old drivers), then the
    affinity columns. The Legend is skipped, except ``NIC Legend`` lines (``NIC0: mlx5_0``). A second header
    row starts a new matrix whose rows overwrite earlier ones. Odd content gives an empty topology with a
    warning. Raises :class:`InputError` when the file cannot be read.
    """
    path = Path(path)
    topo = Topology()
    columns: list[str] = []
    trailing: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    for _, line in iter_lines(path, topo.warnings, max_bytes):
        tokens = line.split()
        if not tokens:
            continue
        m = _NIC_LEGEND.match(line)
        if m:
            topo.nic_names[m.group(1)] = m.group(2)
            continue
        if _DEVICE_RE.match(tokens[0]) and len(tokens) > 1 and (_DEVICE_RE.match(tokens[1]) or tokens[1] == "CPU"):
            header = _HEADER_TOKEN.findall(line)
            columns = [t for t in header if _DEVICE_RE.match(t)]
            trailing = [t for t in header if not _DEVICE_RE.match(t)]
            for c in columns:
                if c not in topo.devices:
                    topo.devices.append(c)
            continue
        if not columns or not _DEVICE_RE.match(tokens[0]) or len(tokens) < 2 or not _LINK_RE.match(tokens[1]):
            continue
        row = tokens[0]
        vals = tokens[1:]
        n = 0
        for col, v in zip(columns, vals, strict=False):
            if not _LINK_RE.match(v):
                break
            n += 1
            if col != row:
                cells[(row, col)] = v
        rest = vals[n:] if n == len(columns) else []
        for col_name, v in zip(trailing, rest, strict=False):
            if col_name == "CPU Affinity":
                topo.cpu_affinity[row] = v
            elif col_name == "NUMA Affinity":
                topo.numa_affinity[row] = v
            elif col_name == "GPU NUMA ID":
                topo.gpu_numa_id[row] = v
    for (a, b), v in list(cells.items()):
        cells.setdefault((b, a), v)
    order = {d: i for i, d in enumerate(topo.devices)}
    big = len(order)
    for (a, b), v in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], big), order.get(kv[0][1], big))):
        topo.links.append(TopoLink(a, b, v))
    if not topo.links:
        topo.warnings.append(f"{path.name}: no nvidia-smi topo -m matrix found")
    return topo
