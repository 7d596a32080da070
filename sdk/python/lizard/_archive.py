"""Several files as one tar archive (``fs.write_files``), with the standard library's
``tarfile``: the archive is unpacked in the deepest directory all the files share, and
names the files relative to it (the server refuses absolute names and ``..``)."""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from typing import Mapping, Tuple, Union


def pack_files(files: Mapping[str, Union[str, bytes]], mode: int) -> Tuple[str, bytes]:
    """(the directory to unpack in, the archive) for ``{absolute path: content}``."""
    if not files:
        raise ValueError("write_files needs at least one file")
    paths = {}
    for path in files:
        norm = posixpath.normpath(path)
        if not path.startswith("/") or norm == "/":
            raise ValueError(f"write_files takes absolute file paths, got {path!r}")
        paths[path] = norm
    directory = posixpath.commonpath([posixpath.dirname(p) for p in paths.values()])
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else bytes(content)
            info = tarfile.TarInfo(posixpath.relpath(paths[path], directory))
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return directory, buf.getvalue()
