"""The app's static files (the docs page's assets, the dashboard's script and styles), served by
Litestar's static files router from a file system that calls a name no file can have missing."""

from __future__ import annotations

import errno
from typing import Any

from litestar.file_system import BaseLocalFileSystem
from litestar.router import Router
from litestar.static_files import create_static_files_router
from litestar.types import PathType
from litestar.types.file_types import FileInfo

# A path that cannot name a file: too long a name, a file used as a directory, a symlink loop.
NO_SUCH_FILE = frozenset({errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP, errno.EINVAL})


class LocalFiles(BaseLocalFileSystem):
    """Litestar turns any OSError but "not found" into a 500; a name that cannot exist is a 404."""

    async def info(self, path: PathType, **kwargs: Any) -> FileInfo:
        try:
            return await super().info(path, **kwargs)
        except OSError as e:
            if e.errno in NO_SUCH_FILE:
                raise FileNotFoundError(e.errno, "no such file", str(path)[:200]) from None
            raise


def static_files_router(path: str, directory: Any, name: str) -> Router:
    return create_static_files_router(path=path, directories=[directory], name=name, file_system=LocalFiles())
