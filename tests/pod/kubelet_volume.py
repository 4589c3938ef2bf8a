"""Write a directory the way the kubelet's atomic writer fills a ConfigMap or Secret volume: the files
in a new ``..<timestamp>`` directory, then ``..data`` renamed atomically to point at it, and each
file a ``name -> ..data/name`` symlink. The new files keep the old ones' mtime (a reader that
checks mtimes only would miss the change)."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

_SEQ = itertools.count()


def kubelet_write(vol: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into the volume directory ``vol`` the way the kubelet's atomic writer does."""
    vol.mkdir(parents=True, exist_ok=True)
    data = vol / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    ts = vol / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{next(_SEQ)}"
    ts.mkdir()
    for name, body in files.items():
        (ts / name).write_bytes(body)
        if old is not None and (vol / old / name).exists():
            st = (vol / old / name).stat()
            os.utime(ts / name, ns=(st.st_atime_ns, st.st_mtime_ns))  # an mtime check would miss it
    tmp = vol / "..data_tmp"
    os.symlink(ts.name, tmp)
    os.replace(tmp, data)
    for name in files:
        if not (vol / name).is_symlink():
            os.symlink(f"..data/{name}", vol / name)
    if old is not None:
        shutil.rmtree(vol / old)
