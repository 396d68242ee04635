"""Where a data file lies, against an independent reading of the file system: random trees of directories, files and
symbolic links (into the table location, out of it, dangling, chained), and every path below the location in them
checked by `misplaced` and by the real path's own comparison (os.path.realpath of the file and of the location: the
same path below both when, and only when, no link lies below the location), which `misplaced` made itself before it
looked at the components below the location instead (4 x faster)."""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator_service.tables.file_paths import misplaced

NAMES = ("a", "b", "c")


def reached_through_a_link(path: str, root: str) -> bool:
    """The oracle: a link below `root` changes the real path of what lies below it (or the path is a link itself); a
    loop of links on the way, which realpath leaves as it is, is a link too."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return True
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    if real != real_root + path[len(root) :]:
        return True
    return os.path.islink(path)


# A tree below the location: each entry a path of names and what lies there (a directory, a file, or a link whose
# target is a path below the location, a path outside it, or nothing that exists).
entries = st.lists(
    st.tuples(
        st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),
        st.sampled_from(["dir", "file", "link-inside", "link-outside", "link-dangling"]),
        st.lists(st.sampled_from(NAMES), min_size=0, max_size=3),
    ),
    max_size=12,
)


def build(location: Path, outside: Path, tree: list[tuple[list[str], str, list[str]]]) -> None:
    for names, kind, target in tree:
        path = location.joinpath(*names)
        if not path.parent.is_dir() or path.is_symlink() or path.exists():
            continue  # a parent that is a file or a link, or a place already taken: the entry is left out
        if kind == "dir":
            path.mkdir()
        elif kind == "file":
            path.write_bytes(b"")
        elif kind == "link-inside":
            path.symlink_to(location.joinpath(*target))
        elif kind == "link-outside":
            path.symlink_to(outside.joinpath(*target))
        else:
            path.symlink_to(location / "nothing-here")


@settings(max_examples=300, deadline=None)
@given(tree=entries, root_is_a_link=st.booleans())
def test_a_path_is_refused_exactly_when_a_link_below_the_location_leads_to_it(
    tree: list[tuple[list[str], str, list[str]]], root_is_a_link: bool
) -> None:
    base = Path(tempfile.mkdtemp())
    try:
        outside = base / "outside"
        for names in [(), *((name,) for name in NAMES), *((a, b) for a in NAMES for b in NAMES)]:
            outside.joinpath(*names).mkdir(parents=True, exist_ok=True)
        real_location = base / "warehouse" / "table"
        real_location.mkdir(parents=True)
        # The location itself may be reached through a link (the operator's mount, a volume): that is allowed.
        location = base / "mounted" if root_is_a_link else real_location
        if root_is_a_link:
            location.symlink_to(real_location)
        build(location, outside, tree)
        paths = [
            str(location.joinpath(*names)) for depth in (1, 2, 3) for names in itertools.product(NAMES, repeat=depth)
        ]
        for path in paths:
            problem = misplaced(Path(path).as_uri(), [location.as_uri()])
            assert (problem is not None) == reached_through_a_link(path, str(location)), (path, problem)
    finally:
        shutil.rmtree(base)
