"""The group store on real files: permissions, refusals, digests, bound, failures (closed)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest

from tests.groups.helpers import child_env, run_py
from visor.audit.paths import visor_home
from visor.groups import store as gs
from visor.groups.identity import GroupIdentity
from visor.groups.index import GroupIndex
from visor.policy import destinations as dst


def _open(group: str = "g1", server: str = "mail", **kw: object) -> gs.GroupStore:
    return gs.GroupStore(group, server, **kw)  # type: ignore[arg-type]


def test_files_are_private_and_in_wal_mode() -> None:
    with _open() as s:
        s.record_outputs(["email:a@b.example"])
        folder = visor_home() / "groups"
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        for name in os.listdir(folder):
            assert stat.S_IMODE(os.lstat(folder / name).st_mode) == 0o600, name
        assert s._c().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert {p.name for p in folder.iterdir()} >= {"g1.sqlite", "g1.sqlite-wal", "g1.sqlite-shm"}


def test_record_and_seen_by_kind() -> None:
    with _open() as s:
        r = s.record({gs.OUTPUT: ["email:a@b.example", "host:b.example"], gs.ASSERTED: ["email:c@d.example"]})
        assert r == gs.RecordResult(3, False)
        assert s.record_outputs(["email:a@b.example"]).added == 0  # already held
        assert s.seen("email:a@b.example") is True
        assert s.seen("email:c@d.example") is False  # asserted is another kind
        assert s.seen("email:c@d.example", gs.ASSERTED) is True
        assert s.seen_any(["token:x", "host:b.example"]) is True
        assert s.seen_any([]) is False
        assert s.where(["host:b.example"]) == "mail"
        assert s.count() == 3
        with pytest.raises(ValueError, match="kind"):
            s.record({7: ["x"]})


def test_keys_are_keyed_digests_that_differ_between_groups() -> None:
    key = "email:victim-address@evil.example"
    with _open("ga") as a, _open("gb") as b:
        a.record_outputs([key])
        b.record_outputs([key])
        assert a.digest(key) != b.digest(key)
        assert a.digest(key, gs.OUTPUT) != a.digest(key, gs.ASSERTED)
        # the same per-group key for every member: a second member of ga agrees
        with _open("ga", "chat") as a2:
            assert a2.digest(key) == a.digest(key)
            assert a2.seen(key) is True
        assert b.seen("email:other@evil.example") is False
    for name in ("ga", "gb"):
        folder = visor_home() / "groups"
        for p in folder.glob(f"{name}.sqlite*"):
            assert b"victim-address" not in p.read_bytes()


def test_taints_and_approvals() -> None:
    with _open(server="mail") as mail, _open(server="chat") as chat:
        assert chat.taints() == frozenset()
        mail.raise_taint("read_secret", "read_file")
        mail.raise_taint("read_secret", "read_file")
        chat.raise_taint("read_secret")
        assert chat.taints() == frozenset({"read_secret"})
        assert mail.taint_sources() == {"read_secret": ("chat", "mail")}
        assert chat.approved("email:bob@corp.example") is False
        mail.approve("email:bob@corp.example", tool="send_email", argument="to")
        mail.approve("email:bob@corp.example", tool="send_email", argument="to", remember=True)
        mail.approve("email:bob@corp.example", tool="send_email", argument="to")  # remember stays
        assert chat.approved("email:bob@corp.example") is True
        assert chat.approved("email:bob@corp.example", tool="post_message") is False
        assert chat.approved("email:bob@corp.example", tool="send_email", argument="to") is True
        assert chat.approvals() == [gs.Approval("email:bob@corp.example", "mail", "send_email", "to", True)]


def test_the_bound_saturates_and_then_absence_proves_nothing() -> None:
    with _open(max_keys=10) as s:
        r = s.record_outputs([f"token:k{i}" for i in range(6)])
        assert r == gs.RecordResult(6, False)
        r = s.record_outputs([f"token:k{i}" for i in range(3, 12)])
        assert r.added == 4 and r.saturated
        assert s.count() == 10
        assert s.saturated is True
        assert all(s.seen(f"token:k{i}") is True for i in range(6))
        later = [s.seen(f"token:k{i}") for i in range(6, 12)]
        assert later.count(True) == 4 and later.count(None) == 2  # dropped at the bound: ask
        assert s.seen("token:never") is None
        # keys already held are no reason to saturate; nothing more is added
        assert s.record_outputs(["token:k1"]) == gs.RecordResult(0, False)
    # the bound is the first member's: a later one cannot raise it
    with _open(max_keys=1000) as s2:
        assert s2.max_keys == 10


def test_a_symlinked_store_is_refused(tmp_path: Path) -> None:
    folder = visor_home() / "groups"
    folder.mkdir(parents=True)
    target = tmp_path / "elsewhere.sqlite"
    target.write_bytes(b"")
    (folder / "g1.sqlite").symlink_to(target)
    with pytest.raises(gs.StoreRefused, match="symbolic link"):
        _open()
    assert target.read_bytes() == b""
    idx = GroupIndex.join(GroupIdentity("g1", "env"), "mail")
    assert not idx.available
    assert idx.seen(dst.parse("bob@corp.example")[0]) is None
    assert idx.taints() is None and idx.approved("email:bob@corp.example") is None


def test_a_symlinked_wal_is_refused(tmp_path: Path) -> None:
    with _open():
        pass
    folder = visor_home() / "groups"
    for p in folder.glob("g1.sqlite-*"):
        p.unlink()
    (folder / "g1.sqlite-wal").symlink_to(tmp_path / "wal")
    with pytest.raises(gs.StoreRefused, match="symbolic link"):
        _open()


def test_a_symlinked_groups_folder_is_refused(tmp_path: Path) -> None:
    home = visor_home()
    home.mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (home / "groups").symlink_to(tmp_path / "other")
    with pytest.raises(gs.StoreRefused, match="not a directory"):
        _open()


def test_loose_permissions_of_our_own_files_are_made_private() -> None:
    with _open():
        pass
    folder = visor_home() / "groups"
    os.chmod(folder, 0o755)
    os.chmod(folder / "g1.sqlite", 0o644)
    with _open() as s:
        assert s.seen("token:x") is False
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(folder / "g1.sqlite").st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file owned by another user needs root")
def test_a_store_owned_by_another_user_is_refused() -> None:
    with _open():
        pass
    path = visor_home() / "groups" / "g1.sqlite"
    os.chown(path, 65534, 65534)
    with pytest.raises(gs.StoreRefused, match="owned by uid 65534"):
        _open()


def test_a_corrupt_file_is_refused_and_the_group_answers_none() -> None:
    folder = visor_home() / "groups"
    folder.mkdir(parents=True)
    (folder / "g1.sqlite").write_bytes(b"this is not a database, it is garbage " * 200)
    os.chmod(folder / "g1.sqlite", 0o600)
    with pytest.raises(gs.StoreCorrupt):
        _open()
    idx = GroupIndex.join(GroupIdentity("g1", "env"), "mail")
    assert not idx.available and "StoreCorrupt" in str(idx.failure)
    assert idx.audit()["group_store"].startswith("unavailable: StoreCorrupt")
    assert idx.seen(dst.parse("bob@corp.example")[0]) is None
    # the failed join left the marker for the other members
    assert (folder / "g1.sqlite-lost").exists()


def test_a_store_corrupted_while_open_answers_none() -> None:
    s = _open()
    s.record_outputs([f"token:k{i}" for i in range(2000)])
    s.close()
    path = visor_home() / "groups" / "g1.sqlite"
    s = _open()
    # another writer's bug or a disk fault: every page after the first overwritten
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * (os.path.getsize(path) - 4096))
    for p in path.parent.glob("g1.sqlite-wal"):
        p.write_bytes(b"")
    answers = {s.seen(f"token:k{i}") for i in range(0, 2000, 97)} | {s.seen("token:never")}
    assert answers <= {True, None} and None in answers  # never a "not seen"
    with pytest.raises(gs.GroupStoreError):
        s.record_outputs(["token:new"])
    assert s.lost
    s.close()


HOLD_EXCLUSIVE = """
import sqlite3, sys, time
c = sqlite3.connect({path!r}, isolation_level=None)
c.execute("PRAGMA locking_mode = EXCLUSIVE")
c.execute("BEGIN EXCLUSIVE")
c.execute("INSERT OR IGNORE INTO meta (k, v) VALUES ('held', 1)")
print("held", flush=True)
sys.stdin.readline()
c.execute("ROLLBACK")
"""

HOLD_WRITE = """
import sqlite3, sys
c = sqlite3.connect({path!r}, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
c.execute("ROLLBACK")
"""


def _holding(code: str, path: Path):  # type: ignore[no-untyped-def]
    from tests.groups.helpers import spawn_py

    p = spawn_py(code.format(path=str(path)))
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _release(p) -> None:  # type: ignore[no-untyped-def]
    p.stdin.write("\n")
    p.stdin.flush()
    p.wait(30)
    assert p.returncode == 0, p.stderr.read()


def test_a_store_locked_by_another_writer_fails_the_write_closed() -> None:
    s = _open()
    s.record_outputs(["token:before"])
    holder = _holding(HOLD_WRITE, s.path)
    try:
        # readers never wait for the writer in WAL mode
        assert s.seen("token:before") is True
        assert s.seen("token:absent") is False
        with pytest.raises(gs.StoreBusy):
            s.record_outputs(["token:during"])
        # the write was lost: from now on no member says "not seen"
        assert s.seen("token:absent") is None
        assert s.taints() is None
    finally:
        _release(holder)
    with _open(server="chat") as other:
        assert other.lost
        assert other.seen("token:absent") is None
        assert other.seen("token:before") is True
    s.close()


def test_a_store_locked_exclusively_cannot_be_joined() -> None:
    # A connection in exclusive locking mode (not Visor's) shuts every other out.
    with _open() as s:
        s.record_outputs(["token:before"])
        path = s.path
    holder = _holding(HOLD_EXCLUSIVE, path)
    try:
        with pytest.raises(gs.StoreBusy):
            _open(join_timeout=0.2)
        idx = GroupIndex.join(GroupIdentity("g1", "env"), "chat", join_timeout=0.2)
        assert not idx.available and "StoreBusy" in str(idx.failure)
        assert idx.seen(dst.parse("bob@corp.example")[0]) is None
        assert idx.taints() is None
        assert idx.approved("email:bob@corp.example") is None
    finally:
        _release(holder)
    # the failed join marked the group: members that can read it no longer say "not seen"
    with _open() as s:
        assert s.seen("token:before") is True
        assert s.seen("token:absent") is None


def test_a_full_store_fails_closed() -> None:
    s = _open()
    s.record_outputs(["token:before"])
    conn = s._c()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")  # no room for one more page
    with pytest.raises(gs.StoreFull):
        s.record_outputs([f"token:k{i}" for i in range(5000)])
    assert s.seen("token:k1") is None
    assert s.seen("token:before") is True
    s.close()


FILE_SIZE_LIMIT = """
import json, resource, signal
from visor.groups import store as gs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
s = gs.GroupStore("g1", "mail")
s.record_outputs(["token:before"])
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
try:
    for n in range(100):
        s.record_outputs([f"token:{n}-{i}" for i in range(1000)])
    err = None
except gs.GroupStoreError as exc:
    err = type(exc).__name__
print(json.dumps([err, s.seen("token:never"), s.seen("token:before")]))
"""


def test_a_file_size_limit_fails_closed() -> None:
    err, never, before = run_py(FILE_SIZE_LIMIT)
    assert err in ("StoreIOError", "StoreFull")
    assert never is None and before is True


AS_NOBODY = """
import os
import visor.groups.index
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
"""

CREATE = """
import json
from visor.groups import store as gs
with gs.GroupStore("g1", "mail") as s:
    s.record_outputs(["token:x"])
print(json.dumps(str(s.path)))
"""

JOIN = """
import json
from visor.groups import store as gs
from visor.groups.index import GroupIndex
from visor.groups.identity import GroupIdentity
from visor.policy import destinations as dst
try:
    gs.GroupStore("g1", "mail")
    err = None
except gs.GroupStoreError as exc:
    err = type(exc).__name__
idx = GroupIndex.join(GroupIdentity("g1", "env"), "mail")
print(json.dumps([err, idx.available, idx.seen(dst.parse("a@b.example")[0])]))
"""


def test_a_read_only_store_cannot_be_joined(tmp_path: Path) -> None:
    # root ignores permissions: then both children run as nobody, in a folder nobody owns
    base = Path(tempfile.mkdtemp(prefix="visor-groups-ro-"))
    try:
        if os.geteuid() == 0:
            os.chown(base, 65534, 65534)
        env = child_env(VISOR_HOME=str(base / "home"))
        path = Path(run_py(AS_NOBODY + CREATE, env=env))
        for p in path.parent.glob("g1.sqlite-*"):
            p.unlink()
        os.chmod(path, 0o400)
        os.chmod(path.parent, 0o500)
        err, available, seen = run_py(AS_NOBODY + JOIN, env=env)
        assert err in ("StoreReadOnly", "StoreIOError")
        assert available is False and seen is None
    finally:
        os.chmod(base / "home" / "groups", 0o700)
        shutil.rmtree(base)


def test_a_closed_store_answers_none_and_refuses_writes() -> None:
    s = _open()
    s.record_outputs(["token:x"])
    s.close()
    assert s.seen("token:x") is None
    with pytest.raises(gs.StoreClosed):
        s.record_outputs(["token:y"])


def test_a_store_of_another_format_is_refused() -> None:
    with _open() as s:
        s._c().execute("UPDATE meta SET v = 99 WHERE k = 'format'")
    with pytest.raises(gs.StoreCorrupt, match="format 99"):
        _open()


def test_sqlite_errors_map_to_specific_failures() -> None:
    def err(name: str) -> sqlite3.Error:
        e = sqlite3.OperationalError(name)
        e.sqlite_errorname = name  # type: ignore[attr-defined]
        return e

    assert isinstance(gs._map_error(err("SQLITE_BUSY"), "x"), gs.StoreBusy)
    assert isinstance(gs._map_error(err("SQLITE_FULL"), "x"), gs.StoreFull)
    assert isinstance(gs._map_error(err("SQLITE_IOERR_WRITE"), "x"), gs.StoreIOError)
    assert isinstance(gs._map_error(err("SQLITE_READONLY"), "x"), gs.StoreReadOnly)
    assert isinstance(gs._map_error(err("SQLITE_NOTADB"), "x"), gs.StoreCorrupt)
    assert isinstance(gs._map_error(OSError(28, "No space left on device"), "x"), gs.StoreFull)


def test_a_member_whose_file_is_pruned_while_it_joins_opens_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _open() as s:
        s.record_outputs(["token:old"])
        path = s.path
    old_ino = os.stat(path).st_ino
    original = gs.GroupStore._init
    calls: list[int] = []

    def pruned_meanwhile(self: gs.GroupStore, *a: object) -> None:
        original(self, *a)  # type: ignore[arg-type]
        if not calls:
            # what prune_stale does between our check of the file and our join
            for p in path.parent.glob("g1.sqlite*"):
                p.unlink()
        calls.append(1)

    monkeypatch.setattr(gs.GroupStore, "_init", pruned_meanwhile)
    with _open() as s:
        assert len(calls) == 2
        assert os.stat(path).st_ino != old_ino or s.seen("token:old") is False
        assert s.seen("token:old") is False  # a fresh group, not the dead file
        s.record_outputs(["token:new"])
    monkeypatch.setattr(gs.GroupStore, "_init", original)
    with _open() as s:
        assert s.seen("token:new") is True
