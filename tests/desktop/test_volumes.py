"""Volumes: a folder that outlives desktops, one writer at a time or many readers, its quota
holding inside, its files reachable without a desktop and never through a link."""

from __future__ import annotations

from pathlib import Path

from cubicle import Desktop, ServiceClient
from cubicle.protocol.service import VolumeMount
from tests.conftest import create_desktop, start_service, stop_service


def _exec(api, desktop_id: str, command: str) -> dict:
    answer = api.post(f"/api/desktops/{desktop_id}/exec", json={"command": command})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_volume_carries_files_from_one_desktop_to_the_next(api, service):
    made = api.post("/api/volumes", json={"name": "team-data", "size_mb": 32})
    assert made.status_code == 201, made.text
    for kept in ("team-data.img", "team-data.json"):  # the service's alone, at rest
        assert (service.data_dir / "volumes" / kept).stat().st_mode & 0o077 == 0
    assert made.json()["mounted_in"] == {}
    assert api.post("/api/volumes", json={"name": "team-data"}).status_code == 409
    desktops: list[str] = []
    try:
        writer = create_desktop(api, volumes={"/home/user/work": "team-data"})
        desktops.append(writer["id"])
        wrote = _exec(api, writer["id"], "echo from the writer > ~/work/note.txt && id -un")
        assert wrote["exit_code"] == 0, wrote
        listed = api.get("/api/volumes/team-data").json()
        assert listed["mounted_in"] == {writer["id"]: "read-write"}

        # one writer at a time: another writer, or a reader, is refused while it runs
        for body in ("team-data", {"volume": "team-data", "read_only": True}):
            refused = api.post("/api/desktops", json={"volumes": {"/mnt/data": body}})
            assert refused.status_code == 409 and writer["id"] in refused.json()["detail"]
        assert api.delete("/api/volumes/team-data").status_code == 409  # in use
        # the quota holds inside: ENOSPC, and the host's image stays within it
        full = _exec(api, writer["id"], "head -c 40M /dev/zero > ~/work/big; echo $?")
        assert "No space left" in full["stderr"], full
        _exec(api, writer["id"], "rm -f ~/work/big")
        assert api.get("/api/volumes/team-data").json()["used_bytes"] <= 32 * 1024 * 1024
        api.delete(f"/api/desktops/{writer['id']}")

        # many readers once the writer is gone; they cannot write
        readers = [
            create_desktop(api, volumes={"/mnt/data": {"volume": "team-data", "read_only": True}})
            for _ in range(2)
        ]
        desktops += [r["id"] for r in readers]
        for reader in readers:
            assert _exec(api, reader["id"], "cat /mnt/data/note.txt")["stdout"] == (
                "from the writer\n"
            )
            denied = _exec(api, reader["id"], "touch /mnt/data/x")
            assert denied["exit_code"] != 0 and "Read-only" in denied["stderr"]
        asked = api.post("/api/desktops", json={"volumes": {"/mnt/data": "team-data"}})
        assert asked.status_code == 409  # no writer while someone reads
        # the files API, without a desktop, while only readers have it
        got = api.get("/api/volumes/team-data/files", params={"path": "note.txt"})
        assert got.status_code == 200 and got.content == b"from the writer\n"
    finally:
        for desktop_id in desktops:
            api.delete(f"/api/desktops/{desktop_id}")
    put = api.put("/api/volumes/team-data/files", params={"path": "in/deep/f.txt"}, content=b"x")
    assert put.status_code == 204, put.text
    assert api.get("/api/volumes/team-data/files", params={"path": "/in/deep/f.txt"}).content == (
        b"x"
    )
    assert api.get("/api/volumes/team-data").json()["mounted_in"] == {}
    assert api.delete("/api/volumes/team-data").status_code == 204
    assert api.get("/api/volumes/team-data").status_code == 404
    assert not (service.data_dir / "volumes" / "team-data.img").exists()


def test_a_link_left_in_a_volume_does_not_lead_out_of_it(api):
    assert api.post("/api/volumes", json={"name": "linked", "size_mb": 16}).status_code == 201
    try:
        desktop = create_desktop(api, volumes={"/mnt/v": "linked"})
        try:
            made = _exec(
                api,
                desktop["id"],
                "ln -s /etc/shadow /mnt/v/shadow && mkdir /mnt/v/d && ln -s /etc /mnt/v/d/up",
            )
            assert made["exit_code"] == 0, made
        finally:
            api.delete(f"/api/desktops/{desktop['id']}")
        for path in ("shadow", "d/up/shadow", "../linked.img", "d/up"):
            answer = api.get("/api/volumes/linked/files", params={"path": path})
            assert answer.status_code in (404, 422), (path, answer.status_code)
            assert b"root:" not in answer.content
        written = api.put(
            "/api/volumes/linked/files", params={"path": "d/up/cubicle-escape"}, content=b"x"
        )
        assert written.status_code in (404, 422)  # a link on the way is never followed
        assert not Path("/etc/cubicle-escape").exists()
        assert api.get("/healthz").status_code == 200
    finally:
        api.delete("/api/volumes/linked")


def test_bad_volume_requests_are_refused_clearly(api):
    assert api.post("/api/volumes", json={"name": "Bad Name"}).status_code == 422
    assert api.post("/api/volumes", json={"name": "tiny", "size_mb": 1}).status_code == 422
    missing = api.post("/api/desktops", json={"volumes": {"/mnt/x": "nope"}})
    assert missing.status_code == 404 and missing.json()["error"] == "volume_not_found"
    outside = api.post("/api/desktops", json={"volumes": {"/etc/x": "nope"}})
    assert outside.status_code == 422
    assert api.get("/api/volumes/nope/files", params={"path": "a"}).status_code == 404
    assert api.delete("/api/volumes/nope").status_code == 404


def test_names_and_paths_that_are_not_a_volumes_are_refused(api):
    """A volume's name is a file name in the service's data directory: a name that could
    reach beside it, or a NUL anywhere, is a clear 4xx, and the service goes on."""
    assert api.post("/api/volumes", json={"name": "kept", "size_mb": 64}).status_code == 201
    try:
        for name in ("%2E%2E", "..%2Fvolumes%2Fkept", "kept%00", "KEPT", ".hidden"):
            answer = api.get(f"/api/volumes/{name}")
            assert answer.status_code in (404, 422), (name, answer.text)
            files = api.get(f"/api/volumes/{name}/files", params={"path": "a"})
            assert files.status_code in (404, 422), (name, files.text)
        nul = api.put("/api/volumes/kept/files", params={"path": "a\x00b"}, content=b"x")
        assert nul.status_code == 422 and nul.json()["error"] == "invalid_request"
        read = api.get("/api/volumes/kept/files", params={"path": "a\x00b"})
        assert read.status_code == 422
        assert api.put("/api/volumes/kept/files", params={"path": "a"}, content=b"ok").is_success
        assert api.get("/api/volumes/kept/files", params={"path": "a"}).content == b"ok"
        assert api.get("/healthz").status_code == 200
    finally:
        assert api.delete("/api/volumes/kept").status_code == 204


def test_a_volume_outlives_a_restart_of_the_service():
    first = start_service(CUBICLE_WARM_POOL="0")
    try:
        with first.client() as api:
            assert api.post("/api/volumes", json={"name": "kept", "size_mb": 16}).is_success
            desktop = create_desktop(api, volumes={"/mnt/kept": "kept"})
            _exec(api, desktop["id"], "echo still here > /mnt/kept/a.txt")
    finally:
        stop_service(first)
    second = start_service(data_dir=first.data_dir, token=first.token, CUBICLE_WARM_POOL="0")
    try:
        with second.client() as api:
            assert [v["name"] for v in api.get("/api/volumes").json()] == ["kept"]
            reader = create_desktop(
                api, volumes={"/mnt/kept": {"volume": "kept", "read_only": True}}
            )
            assert _exec(api, reader["id"], "cat /mnt/kept/a.txt")["stdout"] == "still here\n"
    finally:
        stop_service(second)


def test_the_sdk_makes_and_mounts_a_volume(service):
    connection = {"base_url": service.url, "token": service.token}
    with ServiceClient(**connection) as client:
        made = client.create_volume("sdk-vol", size_mb=16)
        assert made.size_mb == 16 and "sdk-vol" in [v.name for v in client.volumes()]
        try:
            with Desktop.create(volumes={"/mnt/v": "sdk-vol"}, **connection) as desktop:
                assert desktop.exec("echo hi > /mnt/v/hi.txt").exit_code == 0
            reader = VolumeMount(volume="sdk-vol", read_only=True)
            with Desktop.create(volumes={"/home/user/v": reader}, **connection) as desktop:
                assert desktop.files.read("~/v/hi.txt") == b"hi\n"
        finally:
            client.delete_volume("sdk-vol")
